"""The Python package's tests import their helpers from this folder (lychee_test_paths.py).

The package itself must be importable (scripts/test.sh installs it into the test venv): a missing
package fails the run rather than skipping it.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

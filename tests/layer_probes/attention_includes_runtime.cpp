// Must NOT compile: the attention layer may not include the runtime (a layer above it). The test
// Layers.AttentionCannotIncludeRuntime builds this file and expects "No such file or directory".
#include "runtime/engine.h"

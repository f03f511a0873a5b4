// Must NOT compile: the CLI (linking train, eval and runtime) may not include a CUDA header. The
// test Layers.AppsCannotIncludeCuda builds this file and expects "No such file or directory".
#include "cuda/runner/gpu_runner.h"

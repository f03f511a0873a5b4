#include "cuda/runner/runner_impl.h"

namespace lychee::cuda {

cudaGraphExec_t GraphCache::instantiate(cudaGraph_t graph) {
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  LY_CUDA_CHECK(err);
  return exec;
}

void GraphCache::clear() {
  for (auto& [key, execs] : graphs_)
    for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
  graphs_.clear();
}

}  // namespace lychee::cuda

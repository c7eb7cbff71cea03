// specdeploy cuda_toolkit role: proves nvcc builds a kernel for the GPUs' architecture and it runs.
#include <cstdio>

__global__ void fill(int *out) { out[threadIdx.x] = 2 * threadIdx.x; }

int main() {
  int *device = nullptr;
  int host[32] = {0};
  if (cudaMalloc(&device, sizeof host) != cudaSuccess) {
    std::printf("cudaMalloc failed: is the driver loaded?\n");
    return 1;
  }
  fill<<<1, 32>>>(device);
  cudaError_t err = cudaMemcpy(host, device, sizeof host, cudaMemcpyDeviceToHost);
  cudaFree(device);
  if (err != cudaSuccess || host[31] != 62) {
    std::printf("kernel failed: %s\n", cudaGetErrorString(err));
    return 1;
  }
  std::printf("kernel ran\n");
  return 0;
}

"""The CUDA backend: kernels from templates, a host file with a static memory plan, nvcc builds and CPU emulation."""

// A device assert (compiled to ../fixtures/assert.ptx): a failing
// `assert` (NVRTC's builtin macro) calls __assertfail with the message,
// file, line and function.
extern "C" __global__ void checked_div(int n, const int* x, const int* y, int* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    assert(y[i] != 0 && "division by zero");
    out[i] = x[i] / y[i];
}

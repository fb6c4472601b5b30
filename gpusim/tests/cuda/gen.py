# Regenerates gpusim/tests/fixtures/*.ptx from the CUDA sources beside this
# file with pip's NVRTC (compute_80, --fmad=false, as leangrad compiles).
# Run: python3 gpusim/tests/cuda/gen.py
import ctypes, os, nvidia
here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "fixtures")
cu13 = os.path.join(nvidia.__path__[0], "cu13")
nv = ctypes.CDLL(os.path.join(cu13, "lib", "libnvrtc.so.13"))
for f in sorted(os.listdir(here)):
    if not f.endswith(".cu"):
        continue
    src = open(os.path.join(here, f)).read()
    prog = ctypes.c_void_p()
    nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f.encode(), 0, None, None)
    opts = ["--gpu-architecture=compute_80", "--std=c++17", "--fmad=false", f"--include-path={cu13}/include"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    r = nv.nvrtcCompileProgram(prog, len(opts), arr)
    sz = ctypes.c_size_t()
    if r != 0:
        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(sz)); buf = ctypes.create_string_buffer(sz.value)
        nv.nvrtcGetProgramLog(prog, buf); print(f, buf.value.decode()); raise SystemExit(1)
    nv.nvrtcGetPTXSize(prog, ctypes.byref(sz)); buf = ctypes.create_string_buffer(sz.value); nv.nvrtcGetPTX(prog, buf)
    open(os.path.join(out, f[:-3] + ".ptx"), "w").write(buf.value.decode())
    print("wrote", f[:-3] + ".ptx")

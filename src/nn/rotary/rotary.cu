// Rotary position embeddings (as src/nn/rotary/cpu.rs; launched from
// src/nn/rotary/cuda.rs). One thread per (row position l, pair i) computes
// the pair's cos and sin once and rotates that pair in every (batch, head)
// row: the angles' f64 work is spent once per position, not per head.
// Compiled with --fmad=false, so each product and sum rounds as the CPU's.

struct View4 {
    long long offset, batch, head, row, col;
};

struct RotaryGeom {
    long long batch, heads, len, dim;
    View4 x;
    long long start;
    double theta, sin_sign;
};

// Hugging Face's f32 angle p * inv_freq[i], inv_freq[i] = 1 / base^(2i/D)
// (the exponent an f32 division, the power rounded to f32), and its cos
// and sin rounded to f32: cpu.rs's `cos_sin` step for step.
__device__ __forceinline__ void lg_rope_angle(long long p, long long i, long long dim,
                                              double theta, float* c, float* s) {
    float exponent = (float)(2 * i) / (float)dim;
    float power = __double2float_rn(pow(theta, (double)exponent));
    float inv_freq = 1.0f / power;
    double angle = (double)((float)p * inv_freq);
    *c = __double2float_rn(cos(angle));
    *s = __double2float_rn(sin(angle));
}

template <typename T>
__device__ __forceinline__ void lg_rotary(RotaryGeom g, const T* x, T* out) {
    long long half = g.dim / 2, pairs = g.len * half, bhn = g.batch * g.heads;
    LG_GRID_LOOP(t, pairs) {
        long long l = t / half, i = t % half;
        float cf, sf;
        lg_rope_angle(g.start + l, i, g.dim, g.theta, &cf, &sf);
        T c = lg_store<T>((typename Acc<T>::type)cf);
        T s = lg_store<T>((typename Acc<T>::type)(sf * (float)g.sin_sign));
        typename Acc<T>::type ca = lg_load(c), sa = lg_load(s);
        for (long long bh = 0; bh < bhn; ++bh) {
            long long b = bh / g.heads, h = bh % g.heads;
            long long at = g.x.offset + b * g.x.batch + h * g.x.head + l * g.x.row;
            typename Acc<T>::type lo = lg_load(x[at + i * g.x.col]);
            typename Acc<T>::type hi = lg_load(x[at + (i + half) * g.x.col]);
            typename Acc<T>::type lo_c = lg_load(lg_store<T>(lo * ca));
            typename Acc<T>::type hi_s = lg_load(lg_store<T>(hi * sa));
            typename Acc<T>::type hi_c = lg_load(lg_store<T>(hi * ca));
            typename Acc<T>::type lo_s = lg_load(lg_store<T>(lo * sa));
            long long row = (bh * g.len + l) * g.dim;
            out[row + i] = lg_store<T>(lo_c - hi_s);
            out[row + i + half] = lg_store<T>(hi_c + lo_s);
        }
    }
}

#define LG_ROTARY(sfx, T)                                                               \
    extern "C" __global__ void rotary_##sfx(RotaryGeom g, const T* x, T* out) {         \
        lg_rotary<T>(g, x, out);                                                        \
    }
LG_FOR_FLOATS(LG_ROTARY)

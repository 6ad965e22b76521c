// ggml_repack_goldens: what ggml's CPU repack kernels (llama.cpp's default
// `--repack`) compute for the types it interleaves on x86 (Q4_0, IQ4_NL,
// MXFP4: `*_8x8_q8_0`; Q4_K: `q4_K_8x8_q8_K`; Q2_K, on AVX-512 CPUs only:
// `q2_K_8x8_q8_K`), for tests/quant_formats.rs
// `interleaved_weights_equal_ggml_repack_bit_for_bit`.
//
// Per type: a weight [k, m] quantised from seeded normal values with
// ggml_quantize_chunk, put in the CPU backend's CPU_REPACK buffer (which
// interleaves it at set_tensor), and activations [k, n] of f32, one MUL_MAT
// per n; k = 1120 (35 blocks), 1280 for Q4_K and Q2_K (5 super-blocks). m = 24
// rows: two 8-row groups for the AVX-512 gemm's 16 columns and one for its
// 8-column tail; n = 1 (gemv) and 9 (two 4-row gemm tiles and a gemv row).
// The AVX2 and AVX-512 builds give the same file, but for Q2_K, which only
// the AVX-512 build writes (run it on an AVX-512 CPU, with a ggml build
// whose AMX code that CPU runs: build-noamx where AMX faults). Prints JSON: per type
// the GGUF-layout weight bytes and, per product, the activations and the
// output, base64 little-endian.
//
// Build and run (from the repository root, after tools/build-llamacpp.sh):
//   d=~/.cache/longhaul/llama.cpp; inc=$d/src/vendor/llama.cpp/ggml/include
//   g++ -O2 -std=c++17 tools/ggml_repack_goldens.cpp -I$inc -L$d/build/bin \
//     -lggml -lggml-base -lggml-cpu -Wl,-rpath,$d/build/bin -o /tmp/ggml_repack_goldens
//   /tmp/ggml_repack_goldens > tests/goldens/quant/ggml_repack.json

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static std::string b64(const void *data, size_t len) {
    static const char *tab = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const uint8_t *p = (const uint8_t *)data;
    std::string out;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < len) v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < len) v |= p[i + 2];
        out += tab[(v >> 18) & 63];
        out += tab[(v >> 12) & 63];
        out += i + 1 < len ? tab[(v >> 6) & 63] : '=';
        out += i + 2 < len ? tab[v & 63] : '=';
    }
    return out;
}

int main() {
    const int64_t m = 24;
    const int64_t ns[] = {1, 9};
    const ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4, GGML_TYPE_Q4_K, GGML_TYPE_Q2_K};

    ggml_backend_t backend = ggml_backend_cpu_init();
    if (!backend) {
        fprintf(stderr, "ggml_backend_cpu_init failed\n");
        return 1;
    }
    ggml_backend_cpu_set_n_threads(backend, 1);
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack = nullptr;
    for (ggml_backend_buffer_type_t *b = get_extra ? get_extra(dev) : nullptr; b && *b; b++) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) repack = *b;
    }
    if (!repack || !ggml_cpu_has_avx2()) {
        fprintf(stderr, "this ggml build has no CPU_REPACK buffer type or no AVX2\n");
        return 1;
    }

    std::mt19937 rng(20261205);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    printf("{\n  \"source\": \"tools/ggml_repack_goldens.cpp\",\n  \"isa\": \"%s\",\n  \"m\": %lld,\n  \"cases\": [",
           ggml_cpu_has_avx512() ? "avx512" : "avx2", (long long)m);
    bool first_case = true;
    for (ggml_type type : types) {
        // ggml repacks Q2_K on AVX-512 CPUs only (last in `types`, so the
        // other cases' random values are the same in both builds).
        if (type == GGML_TYPE_Q2_K && !ggml_cpu_has_avx512()) continue;
        const bool k_quant = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q2_K;
        const int64_t k = k_quant ? 1280 : 1120;
        std::vector<float> wf((size_t)(k * m));
        for (auto &v : wf) v = normal(rng);
        std::vector<uint8_t> w(ggml_row_size(type, k) * (size_t)m);
        ggml_quantize_chunk(type, wf.data(), w.data(), 0, m, k, nullptr);
        printf("%s\n    {\"type\": \"%s\",\n     \"k\": %lld,\n     \"w\": \"%s\",\n     \"products\": [",
               first_case ? "" : ",", ggml_type_name(type), (long long)k, b64(w.data(), w.size()).c_str());
        first_case = false;
        bool first_product = true;
        for (int64_t n : ns) {
            ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
            ggml_context *ctx = ggml_init(ip);
            ggml_context *wctx = ggml_init(ip);
            ggml_tensor *a = ggml_new_tensor_2d(wctx, type, k, m);
            ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
            ggml_tensor *y = ggml_mul_mat(ctx, a, x);
            ggml_cgraph *gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, y);
            ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack);
            ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
            if (!wbuf || !buf) {
                fprintf(stderr, "alloc failed\n");
                return 1;
            }
            ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            ggml_backend_tensor_set(a, w.data(), 0, w.size());
            if (a->extra == nullptr) {
                fprintf(stderr, "%s: CPU_REPACK did not take the weight\n", ggml_type_name(type));
                return 1;
            }
            std::vector<float> xs((size_t)(k * n));
            for (auto &v : xs) v = normal(rng);
            ggml_backend_tensor_set(x, xs.data(), 0, xs.size() * sizeof(float));
            if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
                fprintf(stderr, "compute failed\n");
                return 1;
            }
            std::vector<float> ys((size_t)(m * n));
            ggml_backend_tensor_get(y, ys.data(), 0, ys.size() * sizeof(float));
            printf("%s\n      {\"n\": %lld,\n       \"x\": \"%s\",\n       \"y\": \"%s\"}",
                   first_product ? "" : ",", (long long)n, b64(xs.data(), xs.size() * sizeof(float)).c_str(),
                   b64(ys.data(), ys.size() * sizeof(float)).c_str());
            first_product = false;
            ggml_backend_buffer_free(buf);
            ggml_backend_buffer_free(wbuf);
            ggml_free(ctx);
            ggml_free(wctx);
        }
        printf("]}");
    }
    printf("\n  ]\n}\n");
    ggml_quantize_free();
    ggml_backend_free(backend);
    return 0;
}

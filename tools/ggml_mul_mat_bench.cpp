// ggml_mul_mat_bench: times ggml's CPU mul_mat for the shapes of
// `longhaul bench --survey`, so the survey can show llama.cpp's numbers
// beside longhaul's (`--llamacpp FILE`).
//
//   ggml_mul_mat_bench --types q4_K,q8_0 --k 2048 --m 768 --n 1,8,32,512
//                      [--threads 2] [--reps 5] [--min-ms 20] [--poll 50] [--repack 1]
//
// For each type: a weight [k, m] (ggml: m rows of k values) quantised from
// random values with ggml_quantize_chunk (types that need an importance
// matrix get a flat one), activations [k, n] of f32, one MUL_MAT node
// computed with the CPU backend (a persistent thread pool, as llama.cpp's
// contexts use) in a plain CPU buffer (no repack: the
// weights are read in GGUF layout, as longhaul reads them), or with
// `--repack 1` in the CPU backend's CPU_REPACK buffer (llama.cpp's default
// `--repack`: the weights interleaved at load for its gemv/gemm kernels,
// where the type and row count have one; `repack=1` in the output). One warm-up
// product, then per repetition the product repeated for at least --min-ms
// milliseconds; one line per (type, n):
//
//   ggml_mul_mat type=q4_K k=2048 m=768 n=8 threads=2 reps=5 mean_ns=.. sd_ns=..
//
// and `skip type=.. reason=..` for a type ggml's CPU backend cannot run.
// Built and run by tools/survey-llamacpp.sh.

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <strings.h>
#include <vector>

static std::vector<std::string> split(const std::string &s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

static bool type_by_name(const std::string &name, ggml_type *out) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *n = ggml_type_name((ggml_type)t);
        if (n && strcasecmp(n, name.c_str()) == 0 && ggml_blck_size((ggml_type)t) > 0 &&
            ggml_type_size((ggml_type)t) > 0) {
            *out = (ggml_type)t;
            return true;
        }
    }
    return false;
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s --types T1,T2 --k K --m M --n N1,N2 [--threads T] [--reps R] [--min-ms MS] [--poll 0..100]\n",
            argv0);
    exit(2);
}

static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// The weight bytes of `type` for [k, m] from random normal values.
static std::vector<uint8_t> weight_bytes(ggml_type type, int64_t k, int64_t m, std::mt19937 &rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x((size_t)(k * m));
    for (auto &v : x) v = normal(rng);
    std::vector<uint8_t> out(ggml_row_size(type, k) * (size_t)m);
    if (type == GGML_TYPE_F32) {
        memcpy(out.data(), x.data(), out.size());
        return out;
    }
    std::vector<float> imatrix;
    if (ggml_quantize_requires_imatrix(type)) imatrix.assign((size_t)k, 1.0f);
    ggml_quantize_chunk(type, x.data(), out.data(), 0, m, k, imatrix.empty() ? nullptr : imatrix.data());
    return out;
}

// The types ggml's CPU_REPACK buffer takes on x86 (repack.cpp's
// ggml_repack_get_optimal_repack_type: AVX2 interleaves 8 rows of these;
// Q2_K only with AVX-512). Other types stay in a plain buffer.
static bool x86_repacks(ggml_type type, int64_t m) {
    if (m % 8 != 0) return false;
    switch (type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_K: case GGML_TYPE_IQ4_NL: case GGML_TYPE_MXFP4: return true;
        case GGML_TYPE_Q2_K: return ggml_cpu_has_avx512();
        default: return false;
    }
}

int main(int argc, char **argv) {
    std::vector<std::string> types;
    std::vector<int64_t> ns;
    int64_t k = 0, m = 0;
    int threads = 1, reps = 5;
    double min_ms = 20.0;
    int poll = -1;  // ggml's default (llama.cpp's --poll 50)
    int repack = 0;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (i + 1 >= argc) usage(argv[0]);
        std::string v = argv[++i];
        if (a == "--types") types = split(v);
        else if (a == "--k") k = atoll(v.c_str());
        else if (a == "--m") m = atoll(v.c_str());
        else if (a == "--n") for (auto &s : split(v)) ns.push_back(atoll(s.c_str()));
        else if (a == "--threads") threads = atoi(v.c_str());
        else if (a == "--reps") reps = atoi(v.c_str());
        else if (a == "--min-ms") min_ms = atof(v.c_str());
        else if (a == "--poll") poll = atoi(v.c_str());
        else if (a == "--repack") repack = atoi(v.c_str());
        else usage(argv[0]);
    }
    if (types.empty() || k <= 0 || m <= 0 || ns.empty() || threads <= 0 || reps <= 0) usage(argv[0]);
    for (auto n : ns) {
        if (n <= 0) usage(argv[0]);
    }

    ggml_backend_t backend = ggml_backend_cpu_init();
    if (!backend) {
        fprintf(stderr, "ggml_backend_cpu_init failed\n");
        return 1;
    }
    ggml_backend_cpu_set_n_threads(backend, threads);
    // A persistent thread pool, as llama.cpp's contexts hold one (without it
    // every graph_compute starts and joins its threads).
    ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    if (poll >= 0) tpp.poll = (uint32_t)poll;
    ggml_threadpool_t pool = ggml_threadpool_new(&tpp);
    if (!pool) {
        fprintf(stderr, "ggml_threadpool_new failed\n");
        return 1;
    }
    ggml_backend_cpu_set_threadpool(backend, pool);
    // The CPU backend's extra buffer types (CPU_REPACK among them).
    ggml_backend_buffer_type_t repack_buft = nullptr;
    if (repack) {
        ggml_backend_dev_t dev = ggml_backend_get_device(backend);
        auto get_extra = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
        for (ggml_backend_buffer_type_t *b = get_extra ? get_extra(dev) : nullptr; b && *b; b++) {
            if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) repack_buft = *b;
        }
        if (!repack_buft) {
            fprintf(stderr, "--repack 1: this ggml build has no CPU_REPACK buffer type\n");
            return 1;
        }
    }
    printf("# ggml_mul_mat_bench: ggml CPU backend, %d threads (poll %u), %d repetitions of at least %.1f ms\n",
           threads, tpp.poll, reps, min_ms);
    std::mt19937 rng(1234);

    for (const auto &name : types) {
        ggml_type type;
        if (!type_by_name(name, &type)) {
            printf("skip type=%s reason=unknown_type\n", name.c_str());
            continue;
        }
        const ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu(type);
        if (type != GGML_TYPE_F32 && (!tr || !tr->vec_dot)) {
            printf("skip type=%s reason=no_cpu_vec_dot\n", ggml_type_name(type));
            continue;
        }
        if (k % ggml_blck_size(type) != 0) {
            printf("skip type=%s reason=k_not_whole_blocks_of_%lld\n", ggml_type_name(type),
                   (long long)ggml_blck_size(type));
            continue;
        }
        std::vector<uint8_t> w = weight_bytes(type, k, m, rng);
        for (int64_t n : ns) {
            ggml_init_params ip = {
                /*.mem_size   =*/ggml_tensor_overhead() * 8 + ggml_graph_overhead(),
                /*.mem_buffer =*/nullptr,
                /*.no_alloc   =*/true,
            };
            ggml_context *ctx = ggml_init(ip);
            ggml_context *wctx = ggml_init(ip);  // the weight alone, for its buffer type
            ggml_tensor *a = ggml_new_tensor_2d(wctx, type, k, m);
            ggml_tensor *b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
            ggml_tensor *c = ggml_mul_mat(ctx, a, b);
            ggml_cgraph *gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, c);
            const bool repacked = repack_buft && x86_repacks(type, m);
            ggml_backend_buffer_t wbuf = repacked ? ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack_buft)
                                                  : ggml_backend_alloc_ctx_tensors(wctx, backend);
            ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
            if (!buf || !wbuf) {
                printf("skip type=%s reason=alloc_failed\n", ggml_type_name(type));
                if (buf) ggml_backend_buffer_free(buf);
                if (wbuf) ggml_backend_buffer_free(wbuf);
                ggml_free(ctx);
                ggml_free(wctx);
                continue;
            }
            if (repacked) ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            ggml_backend_tensor_set(a, w.data(), 0, w.size());
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::vector<float> x((size_t)(k * n));
            for (auto &v : x) v = normal(rng);
            ggml_backend_tensor_set(b, x.data(), 0, x.size() * sizeof(float));

            bool ok = ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;  // warm-up
            int64_t t0 = now_ns();
            ok = ok && ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
            double first = (double)std::max<int64_t>(now_ns() - t0, 1);
            int64_t iters = (int64_t)std::ceil(min_ms * 1e6 / first);
            iters = std::min<int64_t>(std::max<int64_t>(iters, 1), 100000);
            std::vector<double> samples;
            for (int r = 0; ok && r < reps; r++) {
                int64_t s0 = now_ns();
                for (int64_t it = 0; ok && it < iters; it++) {
                    ok = ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
                }
                samples.push_back((double)(now_ns() - s0) / (double)iters);
            }
            if (!ok) {
                printf("skip type=%s reason=compute_failed\n", ggml_type_name(type));
            } else {
                double mean = 0, var = 0;
                for (double s : samples) mean += s;
                mean /= samples.size();
                for (double s : samples) var += (s - mean) * (s - mean);
                double sd = samples.size() > 1 ? std::sqrt(var / (samples.size() - 1)) : 0.0;
                printf("ggml_mul_mat type=%s k=%lld m=%lld n=%lld threads=%d reps=%d mean_ns=%.1f sd_ns=%.1f%s\n",
                       ggml_type_name(type), (long long)k, (long long)m, (long long)n, threads, reps, mean, sd,
                       repacked ? " repack=1" : "");
            }
            fflush(stdout);
            ggml_backend_buffer_free(buf);
            ggml_backend_buffer_free(wbuf);
            ggml_free(ctx);
            ggml_free(wctx);
        }
    }
    ggml_quantize_free();
    ggml_backend_free(backend);
    ggml_threadpool_free(pool);
    return 0;
}

// llama_dump: run one prompt through llama.cpp with the settings of
// tools/llama_logits.cpp (one batch, flash attention off, F32 K/V cache, no
// repack, CPU) and write every graph tensor the eval callback sees, as raw
// little-endian f32 in ggml element order (ne0 fastest), for bit-level
// comparison with longhaul's own intermediates.
//
// Build like llama_logits.cpp (see tools/make-fixtures.sh):
//   g++ -O2 -std=c++17 tools/llama_dump.cpp -I$SRC/include -I$SRC/ggml/include \
//       -L$BIN -lllama -lggml -lggml-base -Wl,-rpath,$BIN -o llama_dump
// usage: llama_dump MODEL OUTDIR N_DECODE (--text STR | --tokens 1,2,3)
//   Writes OUTDIR/s<step>_<seq>_<name>.f32 and an index OUTDIR/index.tsv
//   (file, name, op, ne0..ne3). Step 0 is the prompt batch; steps 1..N_DECODE
//   decode the greedy tokens one at a time.
#include "ggml.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct Dump {
    std::string dir;
    int step = 0;
    int seq = 0;
    FILE * index = nullptr;
};

static bool eval_cb(ggml_tensor * t, bool ask, void * ud) {
    Dump * d = (Dump *) ud;
    if (ask) return t->type == GGML_TYPE_F32;
    if (t->type != GGML_TYPE_F32) return true;
    std::vector<float> out;
    out.reserve(ggml_nelements(t));
    const char * base = (const char *) t->data;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                    float v;
                    memcpy(&v, base + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], 4);
                    out.push_back(v);
                }
    char file[512];
    std::string name = t->name;
    for (char & c : name) if (c == '/' || c == ' ' || c == '(' || c == ')') c = '_';
    snprintf(file, sizeof file, "s%d_%04d_%s.f32", d->step, d->seq++, name.c_str());
    std::string path = d->dir + "/" + file;
    FILE * f = fopen(path.c_str(), "wb");
    if (f) { fwrite(out.data(), 4, out.size(), f); fclose(f); }
    fprintf(d->index, "%s\t%s\t%s\t%lld\t%lld\t%lld\t%lld\n", file, t->name, ggml_op_desc(t),
            (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2], (long long) t->ne[3]);
    return true;
}

static void quiet(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char ** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL OUTDIR N_DECODE (--text STR | --tokens 1,2,3)\n", argv[0]);
        return 2;
    }
    Dump d;
    d.dir = argv[2];
    const int n_decode = atoi(argv[3]);
    d.index = fopen((d.dir + "/index.tsv").c_str(), "w");
    if (!d.index) { fprintf(stderr, "cannot write %s\n", d.dir.c_str()); return 1; }

    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", argv[1]); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256; cp.n_batch = 256; cp.n_ubatch = 256; cp.n_seq_max = 1;
    cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32;
    cp.no_perf = true; cp.offload_kqv = false;
    cp.cb_eval = eval_cb; cp.cb_eval_user_data = &d;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "failed to create context\n"); return 1; }

    std::vector<llama_token> toks;
    std::string mode = argv[4], arg = argv[5];
    if (mode == "--text") {
        int n = -llama_tokenize(vocab, arg.c_str(), (int) arg.size(), nullptr, 0, true, false);
        toks.resize(n);
        llama_tokenize(vocab, arg.c_str(), (int) arg.size(), toks.data(), n, true, false);
    } else {
        size_t pos = 0;
        while (pos < arg.size()) {
            size_t end = arg.find(',', pos);
            if (end == std::string::npos) end = arg.size();
            toks.push_back(atoi(arg.substr(pos, end - pos).c_str()));
            pos = end + 1;
        }
    }
    const int n_tok = (int) toks.size();
    llama_batch b = llama_batch_init(n_tok, 0, 1);
    for (int i = 0; i < n_tok; i++) {
        b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
    }
    b.n_tokens = n_tok;
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
    llama_batch_free(b);
    printf("tokens:");
    for (auto t : toks) printf(" %d", t);
    printf("\ngreedy:");
    const float * l = llama_get_logits_ith(ctx, n_tok - 1);
    for (int s = 1; s <= n_decode; s++) {
        int best = 0;
        for (int i = 1; i < n_vocab; i++) if (l[i] > l[best]) best = i;
        printf(" %d", best);
        d.step = s; d.seq = 0;
        llama_batch one = llama_batch_init(1, 0, 1);
        one.token[0] = best; one.pos[0] = n_tok + s - 1; one.n_seq_id[0] = 1; one.seq_id[0][0] = 0; one.logits[0] = 1;
        one.n_tokens = 1;
        if (llama_decode(ctx, one) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        llama_batch_free(one);
        l = llama_get_logits_ith(ctx, 0);
    }
    printf("\n");
    fclose(d.index);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

// llama_logits: evaluate prompts with llama.cpp and print reference logits as JSON.
//
// Built by tools/make-fixtures.sh against the llama.cpp build of
// tools/build-llamacpp.sh:
//   g++ -O2 -std=c++17 tools/llama_logits.cpp -I$SRC/include -I$SRC/ggml/include \
//       -L$BIN -lllama -lggml -lggml-base -Wl,-rpath,$BIN -o $OUT/llama_logits
//
// usage: llama_logits MODEL [options] PROMPT...
//   PROMPT is either  --tokens 1,2,3   (ids go to the model as they are; no BOS added)
//                or  --text "string"  (tokenized with llama_tokenize(add_special=true,
//                                      parse_special=false), i.e. BOS as llama.cpp adds it)
//   --n-predict N   greedy tokens to decode after each prompt (argmax of raw logits,
//                   lowest id on ties, no stop at EOG)            default 32
//                   greedy_gaps[i] = top1 - top2 logit gap at step i; greedy_gap_min = min;
//                   greedy_text = the greedy tokens as text (llama_token_to_piece)
//   --logits all|last|none  which prompt rows to print             default all
//   --top K         also print the K best (id, logit) of the last prompt row
//   --threads N     default 2;  --ctx N  default 256
//   --fa on|off|auto  flash attention (llama.cpp's -fa)            default off
//   --kv f16|f32      K and V cache type (llama.cpp's -ctk/-ctv)    default f32
//                   (llama.cpp's own defaults are --fa auto --kv f16; the tool's
//                   defaults are the exact path the older goldens were made with)
//   --repack on|off   llama.cpp's --repack (its default: on): ggml's CPU_REPACK
//                   (and, where built, AMX) buffers for the types they take  default off
//                   (on an AMX-reporting VM that cannot run AMX, put a ggml-cpu built
//                   without AMX first on LD_LIBRARY_PATH)
// Fixed settings: one batch for the whole prompt with logits for every position,
// CPU only.
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static void log_cb(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static void print_row(const float * p, int n) {
    putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ",%.9g" : "%.9g", p[i]);
    putchar(']');
}

static void print_ids(const std::vector<llama_token> & v) {
    putchar('[');
    for (size_t i = 0; i < v.size(); i++) printf(i ? ",%d" : "%d", v[i]);
    putchar(']');
}

static void print_json_string(const std::string & s) {
    putchar('"');
    for (unsigned char c : s) {
        switch (c) {
            case '"': fputs("\\\"", stdout); break;
            case '\\': fputs("\\\\", stdout); break;
            case '\n': fputs("\\n", stdout); break;
            case '\r': fputs("\\r", stdout); break;
            case '\t': fputs("\\t", stdout); break;
            default:
                if (c < 0x20) printf("\\u%04x", c); else putchar(c);
        }
    }
    putchar('"');
}

static llama_token argmax(const float * p, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (p[i] > p[best]) best = i;
    return best;
}

// logit gap between the best and the second best token
static float top_gap(const float * p, int n) {
    int best = argmax(p, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++) if (i != best && p[i] > second) second = p[i];
    return p[best] - second;
}

struct Prompt { bool is_text; std::string text; std::vector<llama_token> tokens; };

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL [--n-predict N] [--logits all|last|none] [--top K] "
                        "[--threads N] [--ctx N] [--fa on|off|auto] [--kv f16|f32] (--tokens 1,2,3 | --text STR)...\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    int n_predict = 32, n_threads = 2, n_ctx = 256, top_k = 0;
    std::string logits_mode = "all", fa = "off", kv = "f32", repack = "off";
    std::vector<Prompt> prompts;
    for (int i = 2; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); exit(2); }
            return argv[++i];
        };
        if (a == "--n-predict") n_predict = atoi(next().c_str());
        else if (a == "--threads") n_threads = atoi(next().c_str());
        else if (a == "--ctx") n_ctx = atoi(next().c_str());
        else if (a == "--top") top_k = atoi(next().c_str());
        else if (a == "--logits") logits_mode = next();
        else if (a == "--fa") fa = next();
        else if (a == "--kv") kv = next();
        else if (a == "--repack") repack = next();
        else if (a == "--text") { Prompt p; p.is_text = true; p.text = next(); prompts.push_back(p); }
        else if (a == "--tokens") {
            Prompt p; p.is_text = false;
            std::string s = next();
            size_t pos = 0;
            while (pos < s.size()) {
                size_t end = s.find(',', pos);
                if (end == std::string::npos) end = s.size();
                p.tokens.push_back((llama_token) atoi(s.substr(pos, end - pos).c_str()));
                pos = end + 1;
            }
            prompts.push_back(p);
        } else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
    }

    if (fa != "on" && fa != "off" && fa != "auto") { fprintf(stderr, "--fa takes on, off or auto\n"); return 2; }
    if (kv != "f16" && kv != "f32") { fprintf(stderr, "--kv takes f16 or f32\n"); return 2; }
    if (repack != "on" && repack != "off") { fprintf(stderr, "--repack takes on or off\n"); return 2; }

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = repack == "on";
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", model_path); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = fa == "on"  ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                       : fa == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                     : LLAMA_FLASH_ATTN_TYPE_AUTO;
    cp.type_k = kv == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32;
    cp.type_v = cp.type_k;
    cp.no_perf = true;
    cp.offload_kqv = false;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "failed to create context\n"); return 1; }

    printf("{\"model\":");
    print_json_string(model_path);
    printf(",\"n_vocab\":%d,\"add_bos\":%s,\"settings\":{\"n_threads\":%d,\"n_ctx\":%d,"
           "\"flash_attn\":\"%s\",\"type_kv\":\"%s\",\"use_extra_bufts\":%s},\"prompts\":[",
           n_vocab, llama_vocab_get_add_bos(vocab) ? "true" : "false", n_threads, n_ctx, fa.c_str(), kv.c_str(),
           repack == "on" ? "true" : "false");

    for (size_t pi = 0; pi < prompts.size(); pi++) {
        Prompt & p = prompts[pi];
        if (p.is_text) {
            int n = -llama_tokenize(vocab, p.text.c_str(), (int) p.text.size(), nullptr, 0, true, false);
            p.tokens.resize(n);
            int got = llama_tokenize(vocab, p.text.c_str(), (int) p.text.size(), p.tokens.data(), n, true, false);
            if (got != n) { fprintf(stderr, "tokenize failed\n"); return 1; }
        }
        const int n_tok = (int) p.tokens.size();
        if (n_tok == 0 || n_tok + n_predict > n_ctx) { fprintf(stderr, "bad prompt length %d\n", n_tok); return 1; }
        for (llama_token t : p.tokens) if (t < 0 || t >= n_vocab) { fprintf(stderr, "token %d out of range\n", t); return 1; }

        llama_memory_clear(llama_get_memory(ctx), true);
        llama_batch batch = llama_batch_init(n_tok, 0, 1);
        for (int i = 0; i < n_tok; i++) {
            batch.token[i] = p.tokens[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n_tok;
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        llama_batch_free(batch);

        printf(pi ? ",{" : "{");
        if (p.is_text) { printf("\"text\":"); print_json_string(p.text); putchar(','); }
        printf("\"tokens\":");
        print_ids(p.tokens);
        printf(",\"logits\":");
        if (logits_mode == "none") {
            printf("null");
        } else {
            putchar('[');
            int first = logits_mode == "last" ? n_tok - 1 : 0;
            for (int i = first; i < n_tok; i++) {
                if (i > first) putchar(',');
                print_row(llama_get_logits_ith(ctx, i), n_vocab);
            }
            putchar(']');
        }
        const float * last = llama_get_logits_ith(ctx, n_tok - 1);
        if (top_k > 0) {
            std::vector<int> idx(n_vocab);
            for (int i = 0; i < n_vocab; i++) idx[i] = i;
            std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return last[a] > last[b]; });
            printf(",\"last_top\":[");
            for (int k = 0; k < top_k && k < n_vocab; k++) printf(k ? ",[%d,%.9g]" : "[%d,%.9g]", idx[k], last[idx[k]]);
            putchar(']');
        }
        std::vector<llama_token> gen;
        if (n_predict > 0) {
            llama_token t = argmax(last, n_vocab);
            std::vector<float> gaps = { top_gap(last, n_vocab) };
            for (int s = 0; s < n_predict; s++) {
                gen.push_back(t);
                if (s + 1 == n_predict) break;
                llama_batch b = llama_batch_init(1, 0, 1);
                b.token[0] = t; b.pos[0] = n_tok + s; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1;
                b.n_tokens = 1;
                if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
                llama_batch_free(b);
                const float * l = llama_get_logits_ith(ctx, 0);
                t = argmax(l, n_vocab);
                gaps.push_back(top_gap(l, n_vocab));
            }
            printf(",\"greedy\":");
            print_ids(gen);
            printf(",\"greedy_gap_min\":%.9g,\"greedy_gaps\":", *std::min_element(gaps.begin(), gaps.end()));
            print_row(gaps.data(), (int) gaps.size());
            // The generated tokens as text (llama_token_to_piece, no special
            // tokens rendered), to compare with what llama-completion prints.
            std::string text;
            for (llama_token g : gen) {
                char buf[256];
                int n = llama_token_to_piece(vocab, g, buf, sizeof buf, 0, false);
                if (n > 0) text.append(buf, n);
            }
            printf(",\"greedy_text\":");
            print_json_string(text);
        } else {
            printf(",\"greedy\":null");
        }
        putchar('}');
    }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

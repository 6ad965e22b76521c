//! What `run` and `chat` tell the user about longhaul on stderr.

use longhaul::backend::Backend;
use longhaul::engine::Engine;
use longhaul::longhaul::Policy;

fn mib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// A byte progress bar on stderr labelled `what`, with the rate and the
/// time left.
pub fn bytes_bar(what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, ETA {{eta}})"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// A progress bar on stderr for loads that read weights into memory (shown
/// above 64 MiB), with the rate and the time left.
pub fn load_bar() -> longhaul::model::Progress {
    let bar = indicatif::ProgressBar::hidden();
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "loading {bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    std::sync::Arc::new(move |done, total| {
        if bar.is_hidden() && total > 64 << 20 {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_length(total);
        bar.set_position(done);
        if done >= total {
            bar.finish_and_clear();
        }
    })
}

/// The start-up log of every run: the layer layout and what the KV cache
/// costs (per position, per architecture: MLA caches only its latent).
pub fn model_start<B: Backend>(e: &Engine<B>) {
    let m = &e.model;
    let (dense, moe) = m.layer_counts();
    let nextn = match (m.hp.n_nextn, m.nextn.is_some()) {
        (0, _) => String::new(),
        (1, true) => ", 1 NextN loaded for draft-mtp".to_string(),
        (n, true) => format!(", 1 of {n} NextN loaded for draft-mtp"),
        (n, false) => format!(", {n} NextN not loaded (--spec-type draft-mtp uses it)"),
    };
    let (k, v) = m.hp.kv_widths();
    let n_ctx = e.params.n_ctx;
    let rec = m.hp.recurrent_bytes();
    let total = longhaul::kv::kv_cache_bytes(&m.hp, n_ctx, 1, e.params.kv_type);
    let n_kv = m.hp.n_layer_kv();
    let layers = if n_kv == m.hp.n_layer {
        "per layer".to_string()
    } else {
        format!("per attention layer ({n_kv})")
    };
    eprintln!(
        "model: {} layers ({dense} dense, {moe} MoE{nextn}), {} attention; KV cache {} values per position {layers} ({k} K + {v} V), {} {} at -c {n_ctx}",
        m.hp.n_layer,
        m.attention_kind(),
        k + v,
        mib(total),
        e.params.kv_type.name(),
    );
    if m.repacked_bytes > 0 {
        eprintln!(
            "model: --repack: {} of mapped weights copied into memory in the CPU kernels' interleaved layout (--no-repack reads them in place)",
            mib(m.repacked_bytes)
        );
    }
    if rec > 0 {
        eprintln!(
            "model: recurrent state of {} DeltaNet layers {} per sequence (f32); up to {} checkpoints of it per sequence (--ctx-checkpoints)",
            m.hp.n_layer - n_kv,
            mib(rec),
            e.params.n_ctx_checkpoints
        );
    }
}

/// The start-up log: slots per layer, the budget, and memory outside it.
pub fn longhaul_start<B: Backend>(e: &Engine<B>) {
    let Some(i) = &e.longhaul else { return };
    eprintln!(
        "longhaul: {} MoE layers x {} slots of {} experts ({} per expert per layer); expert budget {} ({})",
        i.n_moe_layers,
        i.n_slots,
        i.n_expert,
        mib(i.expert_bytes),
        mib(i.slot_bytes),
        i.budget_note
    );
    let state = if e.model.hp.recurrent_bytes() > 0 {
        "KV cache and recurrent state"
    } else {
        "KV cache"
    };
    eprintln!(
        "longhaul: outside the budget: resident weights {} (read into memory), {state} {}",
        mib(i.resident_bytes),
        mib(i.kv_bytes)
    );
    if e.params.longhaul.is_some_and(|l| l.uring) && !uring_available() {
        eprintln!("longhaul: --longhaul-io uring: this system gives no io_uring (an old kernel or a sandbox that forbids it); expert reads go through the I/O threads as with dio");
    }
}

#[cfg(target_os = "linux")]
fn uring_available() -> bool {
    longhaul::longhaul::uring::available()
}

#[cfg(not(target_os = "linux"))]
fn uring_available() -> bool {
    false
}

/// Speculative decoding's counters, as llama.cpp's `draft acceptance rate`
/// line, and the expert bytes each generated token cost under longhaul.
/// The draft model's line: its size and the memory it holds apart from
/// the target's (and from its expert budget).
/// `bytes`: what it holds with its sequences.
/// The MTP drafter's line at start: the target's NextN layer drafts.
pub fn mtp_start<B: Backend>(e: &longhaul::engine::Engine<B>, kv_bytes: u64) {
    let hp = &e.model.hp;
    eprintln!(
        "speculative: draft-mtp with NextN layer {} of the model ({} MiB of KV cache of its own; its weights load with the model)",
        hp.n_layer,
        kv_bytes.div_ceil(1 << 20)
    );
}

pub fn draft_model_start<B: Backend>(e: &longhaul::engine::Engine<B>, bytes: u64) {
    eprintln!(
        "draft model: {} layers, {} vocabulary tokens, resident, {} of weights and KV cache (not in the expert budget)",
        e.model.hp.n_layer,
        e.tokenizer.n_vocab(),
        mib(bytes),
    );
}

pub fn speculation(kind: longhaul::spec::SpecType, s: &longhaul::engine::GenStats) {
    let sp = &s.spec;
    eprintln!(
        "speculative: {}, {} verification batches, draft acceptance rate = {:.5} ({:5} accepted / {:5} generated)",
        kind.name(),
        sp.n_batches,
        sp.acceptance(),
        sp.n_accepted,
        sp.n_drafted
    );
    if let Some(io) = s.gen_io.filter(|_| s.n_gen > 0) {
        eprintln!(
            "speculative: expert bytes read per generated token {:.2} MiB ({} tokens)",
            io.bytes_read as f64 / (1u64 << 20) as f64 / s.n_gen as f64,
            s.n_gen
        );
    }
}

/// The prompt's and the decode's longhaul costs apart, per token, and each
/// phase's I/O floor: the prompt's as one step
/// ([`longhaul::longhaul::CacheStats::io_floor_tps`]), the decode's step by
/// step ([`longhaul::longhaul::steps_floor_tps`]).
pub fn longhaul_phases(s: &longhaul::engine::GenStats) {
    let phases = [
        ("prompt", s.prompt_io, s.n_prompt, s.prompt_time, &[][..]),
        (
            "decode",
            s.gen_io,
            s.n_gen_evals,
            s.gen_time,
            &s.gen_steps[..],
        ),
    ];
    for (name, io, n, wall, steps) in phases {
        let Some(c) = io.filter(|_| n > 0) else {
            continue;
        };
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3 / n as f64;
        eprintln!(
            "longhaul {name}: {} misses, {:.2} MiB read per token, reading {:.1} ms per token at {:.0} MB/s, blocked {:.1} ms per token, compute {:.1} ms per token: I/O floor {:.2} tokens per second{}",
            c.misses,
            c.bytes_read as f64 / (1u64 << 20) as f64 / n as f64,
            ms(c.reads_time()),
            c.read_throughput() / 1e6,
            ms(c.io_time),
            ms(wall.saturating_sub(c.io_time)),
            if steps.is_empty() {
                c.io_floor_tps(n, wall)
            } else {
                longhaul::longhaul::steps_floor_tps(steps, n)
            },
            if steps.is_empty() { "" } else { " (step by step)" }
        );
    }
}

/// The end-of-run summary: totals and per-layer counters.
pub fn longhaul_summary<B: Backend>(e: &Engine<B>) {
    let Some((t, per)) = e.longhaul_stats() else {
        return;
    };
    eprintln!(
        "longhaul: hits {} misses {} (hit rate {:.1}%), expert bytes read {}, {:.0} MB/s while reading, {:.2} s reading, {:.2} s blocked on I/O ({} experts computed during reads), {} waves ({} batches needed more than one)",
        t.hits,
        t.misses,
        100.0 * t.hit_rate(),
        mib(t.bytes_read),
        t.read_throughput() / 1e6,
        t.read_time.as_secs_f64(),
        t.io_time.as_secs_f64(),
        t.overlapped,
        t.waves,
        t.multi_wave_batches
    );
    if t.prefetched > 0 {
        eprintln!(
            "longhaul: lookahead prefetch read {} experts ({}), precision {:.1}%, recall {:.1}%",
            t.prefetched,
            mib(t.prefetch_bytes),
            100.0 * t.prefetch_precision(),
            100.0 * t.prefetch_recall()
        );
    }
    if e.params.longhaul.as_ref().map(|l| l.policy) == Some(Policy::Auto) {
        let by = e.model.longhaul_evicting_by();
        let lfu = by.iter().filter(|&&p| p == Policy::Lfu).count();
        eprintln!(
            "longhaul: policy auto: evicting by LFU in {lfu} of {} layers, by LRU in the rest (whichever missed less on the layer's recent batches)",
            by.len()
        );
    }
    if let Some(c) = e.model.lookahead_choice() {
        eprintln!(
            "longhaul: lookahead auto: {} ({:.1} ms per decode step with it, {:.1} ms without; {} measurement{})",
            if c.on { "on" } else { "off" },
            c.with.as_secs_f64() * 1e3,
            c.without.as_secs_f64() * 1e3,
            c.rounds,
            if c.rounds == 1 { "" } else { "s" }
        );
    }
    if std::env::var_os("LONGHAUL_LAYER_STATS").is_some() {
        for (il, s) in per.iter().enumerate().filter(|(_, s)| s.waves > 0) {
            eprintln!(
                "  layer {il:3}: hit rate {:5.1}%  read {:>10}  blocked {:.3} s  waves {}",
                100.0 * s.hit_rate(),
                mib(s.bytes_read),
                s.io_time.as_secs_f64(),
                s.waves
            );
        }
    }
}

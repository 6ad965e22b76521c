//! The pure parts of `longhaul bench --survey` ([`crate::survey`]): bits per
//! weight, the ranking by time per bit, the markdown table and the lines of
//! `tools/ggml_mul_mat_bench` (llama.cpp's times for the same products).
//! No clock and no backend here: everything is a function of its input.

use std::collections::HashMap;

use longhaul::tensor::GgmlType;

use crate::bench_out::mean_sd;

/// One expert matrix: rows of `k` values (`ne0`, the product's inner
/// dimension), `n` rows (`ne1`, the outputs), as GGUF stores `ffn_*_exps`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Shape {
    /// `gate/up` or `down`.
    pub(crate) label: &'static str,
    pub(crate) k: usize,
    pub(crate) n: usize,
}

impl Shape {
    pub(crate) fn new(label: &'static str, k: usize, n: usize) -> Self {
        Self { label, k, n }
    }
}

/// The timed repetitions of one (placement, shape, type, token count).
#[derive(Clone, Debug)]
pub(crate) struct Measured {
    /// `CPU` or the GPU adapter.
    pub(crate) placement: String,
    /// CPU threads; `None` on the GPU.
    pub(crate) threads: Option<usize>,
    /// Index into the survey's shapes.
    pub(crate) shape: usize,
    pub(crate) ty: GgmlType,
    /// The CPU dot kernel ("avx512vnni", "scalar") or "wgsl".
    pub(crate) kernel: String,
    pub(crate) n_tok: usize,
    /// Nanoseconds of one product, per repetition.
    pub(crate) ns: Vec<f64>,
}

/// Effective bits per weight of a type: `type_size * 8 / block_size`
/// (Q4_K: 144 bytes per 256 weights = 4.5).
pub(crate) fn bpw(ty: GgmlType) -> f64 {
    ty.type_size() as f64 * 8.0 / ty.block_size() as f64
}

/// Picoseconds per bit of weight data and per token: `ns / (k * n * bpw *
/// n_tok)`, the survey's ranking key (lower is better).
pub(crate) fn ps_per_bit(ns: f64, shape: &Shape, ty: GgmlType, n_tok: usize) -> f64 {
    ns * 1e3 / (shape.k as f64 * shape.n as f64 * bpw(ty) * n_tok as f64)
}

/// One token count of one ranked type.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cell {
    pub(crate) mean_ns: f64,
    pub(crate) sd_ns: f64,
    pub(crate) ps_per_bit: f64,
}

/// A type's row of a group: its cells in the survey's token order.
#[derive(Clone, Debug)]
pub(crate) struct Ranked {
    pub(crate) ty: GgmlType,
    pub(crate) kernel: String,
    pub(crate) cells: Vec<Option<Cell>>,
}

/// The ranking of one (placement, threads, shape).
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub(crate) placement: String,
    pub(crate) threads: Option<usize>,
    pub(crate) shape: Shape,
    /// Fastest per bit first at the ranking token count.
    pub(crate) rows: Vec<Ranked>,
}

impl Group {
    pub(crate) fn title(&self) -> String {
        let place = match self.threads {
            Some(t) => format!(
                "{}, {t} thread{}",
                self.placement,
                if t == 1 { "" } else { "s" }
            ),
            None => self.placement.clone(),
        };
        format!(
            "{place}: {} {} x {}",
            self.shape.label, self.shape.k, self.shape.n
        )
    }
}

/// Groups `measured` by (placement, threads, shape) in the order they were
/// measured, and sorts each group's types by picoseconds per bit at
/// `rank_by` tokens (types without that cell last, then by type id).
pub(crate) fn rank(
    measured: &[Measured],
    shapes: &[Shape],
    tokens: &[usize],
    rank_by: usize,
) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for m in measured {
        let Some(shape) = shapes.get(m.shape) else {
            continue;
        };
        let Some(col) = tokens.iter().position(|&t| t == m.n_tok) else {
            continue;
        };
        let gi = match groups
            .iter()
            .position(|g| g.placement == m.placement && g.threads == m.threads && g.shape == *shape)
        {
            Some(i) => i,
            None => {
                groups.push(Group {
                    placement: m.placement.clone(),
                    threads: m.threads,
                    shape: shape.clone(),
                    rows: Vec::new(),
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[gi];
        let ri = match g.rows.iter().position(|r| r.ty == m.ty) {
            Some(i) => i,
            None => {
                g.rows.push(Ranked {
                    ty: m.ty,
                    kernel: m.kernel.clone(),
                    cells: vec![None; tokens.len()],
                });
                g.rows.len() - 1
            }
        };
        let (mean_ns, sd_ns) = mean_sd(&m.ns);
        g.rows[ri].cells[col] = Some(Cell {
            mean_ns,
            sd_ns,
            ps_per_bit: ps_per_bit(mean_ns, shape, m.ty, m.n_tok),
        });
    }
    // Placements in the order they were measured, then shapes.
    let mut places: Vec<(&str, Option<usize>)> = Vec::new();
    for m in measured {
        if !places.contains(&(m.placement.as_str(), m.threads)) {
            places.push((m.placement.as_str(), m.threads));
        }
    }
    let place_of = |g: &Group| {
        places
            .iter()
            .position(|&(p, t)| p == g.placement && t == g.threads)
    };
    groups.sort_by_key(|g| (place_of(g), shapes.iter().position(|s| *s == g.shape)));
    let key_col = tokens.iter().position(|&t| t == rank_by);
    for g in &mut groups {
        let key = |r: &Ranked| {
            key_col
                .and_then(|c| r.cells[c].as_ref())
                .map_or(f64::INFINITY, |c| c.ps_per_bit)
        };
        g.rows.sort_by(|a, b| {
            key(a)
                .total_cmp(&key(b))
                .then((a.ty as u32).cmp(&(b.ty as u32)))
        });
    }
    groups
}

/// llama.cpp's times: `(type, k, n, tokens, threads)` -> mean nanoseconds.
#[derive(Clone, Debug, Default)]
pub(crate) struct GgmlTimes(HashMap<(GgmlType, usize, usize, usize, usize), f64>);

impl GgmlTimes {
    pub(crate) fn get(
        &self,
        ty: GgmlType,
        shape: &Shape,
        n_tok: usize,
        threads: usize,
    ) -> Option<f64> {
        self.0.get(&(ty, shape.k, shape.n, n_tok, threads)).copied()
    }
}

/// Parses the lines `tools/ggml_mul_mat_bench` prints:
/// `ggml_mul_mat type=q4_K k=2048 m=768 n=8 threads=2 reps=5 mean_ns=.. sd_ns=..`
/// (ggml's names: `m` weight rows, `n` tokens). Other lines (comments,
/// skips) are ignored; so are types longhaul does not know.
pub(crate) fn parse_ggml(text: &str) -> anyhow::Result<GgmlTimes> {
    let mut out = GgmlTimes::default();
    for (i, line) in text.lines().enumerate() {
        let mut words = line.split_whitespace();
        if words.next() != Some("ggml_mul_mat") {
            continue;
        }
        let kv: HashMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
        let num = |k: &str| -> anyhow::Result<f64> {
            kv.get(k)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| anyhow::anyhow!("line {}: no number {k}= in `{line}`", i + 1))
        };
        let Some(ty) = kv.get("type").and_then(|t| GgmlType::from_name(t)) else {
            continue;
        };
        let key = (
            ty,
            num("k")? as usize,
            num("m")? as usize,
            num("n")? as usize,
            num("threads")? as usize,
        );
        out.0.insert(key, num("mean_ns")?);
    }
    Ok(out)
}

/// What the table's preamble says.
pub(crate) struct Header {
    pub(crate) source: String,
    pub(crate) cpu: String,
    pub(crate) reps: usize,
    pub(crate) n_exp: usize,
    pub(crate) rank_by: usize,
}

/// A table with padded columns; `right[i]` right-aligns column `i`.
fn table(head: &[String], right: &[bool], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..head.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([head[i].chars().count(), 3])
                .max()
                .unwrap_or(3)
        })
        .collect();
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = " ".repeat(widths[i].saturating_sub(c.chars().count()));
                if right[i] {
                    format!(" {pad}{c} ")
                } else {
                    format!(" {c}{pad} ")
                }
            })
            .collect();
        format!("|{}|\n", parts.join("|"))
    };
    let rule: Vec<String> = widths
        .iter()
        .zip(right)
        .map(|(&w, &r)| {
            if r {
                format!("{}:", "-".repeat(w - 1))
            } else {
                "-".repeat(w)
            }
        })
        .collect();
    let mut s = line(head);
    s += &line(&rule);
    for r in rows {
        s += &line(r);
    }
    s
}

/// The survey as markdown: a preamble, then one ranked table per group with
/// per token count the time of one product (mean ± stddev, µs), its
/// picoseconds per bit and token, and, with `ggml`, longhaul's time over
/// llama.cpp's (CPU groups with the same thread count).
pub(crate) fn markdown(
    h: &Header,
    groups: &[Group],
    tokens: &[usize],
    ggml: Option<&GgmlTimes>,
) -> String {
    let mut s = String::from("# Kernel survey: expert products, time per bit of weight data\n\n");
    s += &format!(
        "- shapes from {}; weights of {} expert{} per matrix (call j reads expert j mod {})\n",
        h.source,
        h.n_exp,
        if h.n_exp == 1 { "" } else { "s" },
        h.n_exp
    );
    if !h.cpu.is_empty() {
        s += &format!("- CPU: {}\n", h.cpu);
    }
    s += &format!(
        "- `mul_mat_id` of tN tokens on one expert, {} repetitions; `us`: one product, mean ± stddev\n",
        h.reps
    );
    s += "- `ps/bit`: picoseconds per bit of weight data per token, time / (k × n × bpw × tokens), bpw = type_size × 8 / block_size; lower is better\n";
    s += &format!("- ranked by ps/bit at t{}\n", h.rank_by);
    if ggml.is_some() {
        s += "- `/ggml`: longhaul's time over llama.cpp's (ggml CPU mul_mat of the same matrix, tools/survey-llamacpp.sh); below 1 longhaul is faster\n";
    }
    for g in groups {
        s += &format!("\n## {}\n\n", g.title());
        let ratio = match (ggml, g.threads) {
            (Some(t), Some(th)) => Some((t, th)),
            _ => None,
        };
        let mut head: Vec<String> = ["rank", "type", "bpw", "kernel"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut right = vec![true, false, true, false];
        for t in tokens {
            head.push(format!("t{t} us"));
            head.push(format!("t{t} ps/bit"));
            right.extend([true, true]);
            if ratio.is_some() {
                head.push(format!("t{t} /ggml"));
                right.push(true);
            }
        }
        let rows: Vec<Vec<String>> = g
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut row = vec![
                    (i + 1).to_string(),
                    r.ty.name().to_string(),
                    format!("{:.2}", bpw(r.ty)),
                    r.kernel.clone(),
                ];
                for (c, &t) in r.cells.iter().zip(tokens) {
                    match c {
                        Some(c) => {
                            row.push(format!("{:.2} ± {:.2}", c.mean_ns / 1e3, c.sd_ns / 1e3));
                            row.push(format!("{:.3}", c.ps_per_bit));
                        }
                        None => row.extend(["-".to_string(), "-".to_string()]),
                    }
                    if let Some((times, th)) = ratio {
                        let v = match (c, times.get(r.ty, &g.shape, t, th)) {
                            (Some(c), Some(ns)) if ns > 0.0 => format!("{:.2}", c.mean_ns / ns),
                            _ => "-".to_string(),
                        };
                        row.push(v);
                    }
                }
                row
            })
            .collect();
        s += &table(&head, &right, &rows);
    }
    s += &format!("\nbuild: longhaul {}\n", env!("CARGO_PKG_VERSION"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(placement: &str, shape: usize, ty: GgmlType, n_tok: usize, ns: &[f64]) -> Measured {
        Measured {
            placement: placement.into(),
            threads: (placement == "CPU").then_some(2),
            shape,
            ty,
            kernel: "avx2".into(),
            n_tok,
            ns: ns.to_vec(),
        }
    }

    fn shapes() -> Vec<Shape> {
        vec![
            Shape::new("gate/up", 2048, 768),
            Shape::new("down", 768, 2048),
        ]
    }

    #[test]
    fn bits_per_weight_follow_the_block_geometry() {
        assert_eq!(bpw(GgmlType::Q4_K), 4.5);
        assert_eq!(bpw(GgmlType::Q8_0), 8.5);
        assert_eq!(bpw(GgmlType::Q6_K), 6.5625);
        assert_eq!(bpw(GgmlType::IQ4_XS), 4.25);
        assert_eq!(bpw(GgmlType::MXFP4), 4.25);
        assert_eq!(bpw(GgmlType::F16), 16.0);
        assert_eq!(bpw(GgmlType::F32), 32.0);
        // 1 ms over 2048 x 768 Q4_K weights (7 077 888 bits) at one token.
        let s = Shape::new("gate/up", 2048, 768);
        let ps = ps_per_bit(1e6, &s, GgmlType::Q4_K, 1);
        assert!((ps - 1e9 / 7_077_888.0).abs() < 1e-9, "{ps}");
        // Eight tokens in eight times the time cost the same per bit and token.
        assert_eq!(ps_per_bit(8e6, &s, GgmlType::Q4_K, 8), ps);
    }

    #[test]
    fn ranking_is_by_time_per_bit_at_the_chosen_token_count() {
        use GgmlType as T;
        let s = &shapes()[0];
        let bits = |ty: T| s.k as f64 * s.n as f64 * bpw(ty);
        // Per bit at t1: F16 fastest (1 ps), then Q8_0 (2), then Q4_K (3);
        // at t8 the order of Q8_0 and Q4_K flips.
        let ms = vec![
            m("CPU", 0, T::Q4_K, 1, &[3e-3 * bits(T::Q4_K); 3]),
            m("CPU", 0, T::Q4_K, 8, &[8.0 * 1e-3 * bits(T::Q4_K); 3]),
            m("CPU", 0, T::Q8_0, 1, &[2e-3 * bits(T::Q8_0); 3]),
            m("CPU", 0, T::Q8_0, 8, &[8.0 * 4e-3 * bits(T::Q8_0); 3]),
            m("CPU", 0, T::F16, 1, &[1e-3 * bits(T::F16); 3]),
            m("GPU", 1, T::Q4_K, 1, &[1.0, 2.0, 3.0]),
            m("CPU", 1, T::Q4_K, 1, &[1.0]),
        ];
        let g = rank(&ms, &shapes(), &[1, 8], 1);
        // CPU before GPU (measured first), then shapes in order.
        assert_eq!(g.len(), 3);
        assert_eq!(g[1].title(), "CPU, 2 threads: down 768 x 2048");
        let g: Vec<Group> = g
            .into_iter()
            .filter(|g| g.rows.len() > 1 || g.placement == "GPU")
            .collect();
        let order: Vec<T> = g[0].rows.iter().map(|r| r.ty).collect();
        assert_eq!(order, [T::F16, T::Q8_0, T::Q4_K]);
        let c = g[0].rows[0].cells[0].as_ref().unwrap();
        assert!((c.ps_per_bit - 1.0).abs() < 1e-9, "{c:?}");
        // F16 has no t8 cell: last when ranking by t8.
        let g8 = rank(&ms, &shapes(), &[1, 8], 8);
        let order: Vec<T> = g8[0].rows.iter().map(|r| r.ty).collect();
        assert_eq!(order, [T::Q4_K, T::Q8_0, T::F16]);
        assert_eq!(g[1].title(), "GPU: down 768 x 2048");
        assert_eq!(g[1].rows[0].cells[0].as_ref().unwrap().mean_ns, 2.0);
        assert_eq!(g[1].rows[0].cells[0].as_ref().unwrap().sd_ns, 1.0);
        assert_eq!(g[0].title(), "CPU, 2 threads: gate/up 2048 x 768");
    }

    #[test]
    fn ggml_lines_parse_and_unknown_lines_are_skipped() {
        let text = "# ggml_mul_mat_bench\n\
            ggml_mul_mat type=q4_K k=2048 m=768 n=8 threads=2 reps=5 mean_ns=2000 sd_ns=10\n\
            ggml_mul_mat type=tq9_9 k=2048 m=768 n=8 threads=2 reps=5 mean_ns=1 sd_ns=0\n\
            skip type=iq1_s reason=whatever\n";
        let t = parse_ggml(text).unwrap();
        let s = &shapes()[0];
        assert_eq!(t.get(GgmlType::Q4_K, s, 8, 2), Some(2000.0));
        assert_eq!(t.get(GgmlType::Q4_K, s, 8, 1), None);
        let bad = parse_ggml("ggml_mul_mat type=q8_0 k=1 m=1 n=1 threads=1 mean_ns=x");
        assert!(bad.unwrap_err().to_string().contains("mean_ns"));
    }

    #[test]
    fn markdown_has_the_ranked_rows_and_the_ratio() {
        use GgmlType as T;
        let ms = vec![
            m("CPU", 0, T::Q4_K, 1, &[4000.0, 6000.0]),
            m("CPU", 0, T::Q8_0, 1, &[1000.0, 1000.0]),
        ];
        let g = rank(&ms, &shapes(), &[1], 1);
        let ggml =
            parse_ggml("ggml_mul_mat type=q8_0 k=2048 m=768 n=1 threads=2 mean_ns=500 sd_ns=1")
                .unwrap();
        let h = Header {
            source: "preset qwen3-30b-a3b".into(),
            cpu: String::new(),
            reps: 2,
            n_exp: 1,
            rank_by: 1,
        };
        let md = markdown(&h, &g, &[1], Some(&ggml));
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
        let cells = |l: &str| -> Vec<String> {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        };
        assert_eq!(
            cells(lines[0]),
            [
                "rank",
                "type",
                "bpw",
                "kernel",
                "t1 us",
                "t1 ps/bit",
                "t1 /ggml"
            ]
        );
        // Q8_0: 1 us over 2048*768*8.5 bits = 0.075 ps/bit; twice ggml's time.
        assert_eq!(
            cells(lines[2]),
            ["1", "q8_0", "8.50", "avx2", "1.00 ± 0.00", "0.075", "2.00"]
        );
        assert_eq!(
            cells(lines[3]),
            ["2", "q4_K", "4.50", "avx2", "5.00 ± 1.41", "0.706", "-"]
        );
        assert!(md.contains("## CPU, 2 threads: gate/up 2048 x 768"), "{md}");
        assert_eq!(lines.len(), 4);
    }
}

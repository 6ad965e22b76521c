//! Hand-written SVG for `longhaul advise`: hit rate against cache size (one
//! line per policy) and a per-layer expert-popularity heat map. Plain SVG 1.1,
//! no dependencies; every string placed in the document is escaped.

use std::fmt::Write;

use longhaul::longhaul::advisor::{Report, Trace};

const COLORS: [&str; 4] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Round tick steps (1, 2 or 5 times a power of ten) giving about `n` ticks.
fn nice_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / n;
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

fn fmt_tick(v: f64, step: f64) -> String {
    let dec = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.dec$}")
}

/// Hit rate (%) against expert-cache GiB, one polyline per policy.
pub fn hit_rate_plot(r: &Report, title: &str) -> String {
    let (w, h) = (760.0, 480.0);
    let (l, rgt, top, bot) = (70.0, 150.0, 50.0, 60.0);
    let (pw, ph) = (w - l - rgt, h - top - bot);
    let gib = |n: usize| r.cache_bytes(n) as f64 / (1u64 << 30) as f64;
    let x_max = gib(r.n_expert.max(1));
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let px = |x: f64| l + pw * x / x_max;
    let py = |y: f64| top + ph * (1.0 - y);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="25" text-anchor="middle" font-size="15">{}</text>"#,
        l + pw / 2.0,
        esc(title)
    );
    // Grid and ticks.
    for i in 0..=5 {
        let y = i as f64 / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{l}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#ddd"/><text x="{2:.1}" y="{3:.1}" text-anchor="end">{4}%</text>"##,
            py(y),
            l + pw,
            l - 6.0,
            py(y) + 4.0,
            i * 20
        );
    }
    let step = nice_step(x_max, 6.0);
    let mut x = 0.0;
    while x <= x_max * 1.0001 {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1:.1}" stroke="#eee"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle">{3}</text>"##,
            px(x),
            top + ph,
            top + ph + 18.0,
            fmt_tick(x, step)
        );
        x += step;
    }
    let _ = writeln!(
        s,
        r#"<rect x="{l}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">expert cache (--longhaul-cache, GiB)</text>"#,
        l + pw / 2.0,
        h - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{0}" text-anchor="middle" transform="rotate(-90 18 {0})">hit rate</text>"#,
        top + ph / 2.0
    );
    for (i, (strategy, points)) in r.curves.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> = points
            .iter()
            .map(|p| format!("{:.1},{:.1}", px(gib(p.n_slots)), py(p.counts.hit_rate())))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#,
            pts.join(" ")
        );
        if points.len() <= 64 {
            for p in points {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{c}"/>"#,
                    px(gib(p.n_slots)),
                    py(p.counts.hit_rate())
                );
            }
        }
        let ly = top + 10.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{2}" y="{3}">{4}</text>"#,
            l + pw + 15.0,
            l + pw + 40.0,
            l + pw + 46.0,
            ly + 4.0,
            strategy.name()
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Each traced layer's share of token uses per expert, scaled so the
/// layer's most used expert is darkest.
pub fn popularity_heatmap(t: &Trace, title: &str) -> String {
    let n_e = t.n_expert.max(1);
    let n_l = t.layers.len().max(1);
    let cw = (900.0 / n_e as f64).clamp(2.0, 24.0);
    let ch = (600.0 / n_l as f64).clamp(3.0, 24.0);
    let (l, top) = (70.0, 50.0);
    let (pw, ph) = (cw * n_e as f64, ch * n_l as f64);
    let (w, h) = (l + pw + 110.0, top + ph + 60.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.1} {h:.1}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w:.1}" height="{h:.1}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="25" text-anchor="middle" font-size="15">{}</text>"#,
        l + pw / 2.0,
        esc(title)
    );
    let shade = |v: f64| {
        let v = v.clamp(0.0, 1.0);
        let mix = |a: f64, b: f64| (a + (b - a) * v).round() as u8;
        format!(
            "#{:02x}{:02x}{:02x}",
            mix(255.0, 8.0),
            mix(255.0, 48.0),
            mix(255.0, 107.0)
        )
    };
    for (row, lt) in t.layers.iter().enumerate() {
        let max = lt.uses.iter().copied().max().unwrap_or(0).max(1) as f64;
        let y = top + ch * row as f64;
        for (e, &u) in lt.uses.iter().enumerate() {
            if u == 0 {
                continue;
            }
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{y:.1}" width="{cw:.2}" height="{ch:.2}" fill="{}"/>"#,
                l + cw * e as f64,
                shade(u as f64 / max)
            );
        }
        if n_l <= 64 || row % (n_l / 32).max(1) == 0 {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10">{}</text>"#,
                l - 4.0,
                y + ch / 2.0 + 3.0,
                lt.layer
            );
        }
    }
    let _ = writeln!(
        s,
        r#"<rect x="{l}" y="{top}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="black"/>"#
    );
    let step = nice_step(n_e as f64, 8.0).max(1.0) as usize;
    for e in (0..n_e).step_by(step) {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{e}</text>"#,
            l + cw * (e as f64 + 0.5),
            top + ph + 14.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">expert id</text><text x="18" y="{2:.1}" text-anchor="middle" transform="rotate(-90 18 {2:.1})">layer</text>"#,
        l + pw / 2.0,
        top + ph + 34.0,
        top + ph / 2.0
    );
    // Legend: a ramp from unused to the layer's most used expert.
    let lx = l + pw + 30.0;
    for i in 0..10 {
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{:.1}" width="16" height="12" fill="{}"/>"#,
            top + 12.0 * (9 - i) as f64,
            shade(i as f64 / 9.0)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{0:.1}" y="{1:.1}" font-size="10">max</text><text x="{0:.1}" y="{2:.1}" font-size="10">0</text>"#,
        lx + 20.0,
        top + 10.0,
        top + 118.0
    );
    s.push_str("</svg>\n");
    s
}

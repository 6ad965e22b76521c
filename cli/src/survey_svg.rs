//! The survey's bar chart ([`crate::survey`]): one panel per (placement,
//! threads, shape), the types along x in the panel's rank order, one bar
//! per token count of picoseconds per bit and token (log scale; lower is
//! better). Drawn with plotters' SVG backend (its built-in text metrics:
//! no font files are read).

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::survey_table::Group;

/// Bar colours, one per token count (then repeated).
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

const PANEL_HEIGHT: u32 = 340;

/// The chart as an SVG document.
pub(crate) fn render(groups: &[Group], tokens: &[usize]) -> Result<String, String> {
    let n_types = groups
        .iter()
        .map(|g| g.rows.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let width = (120 + n_types * (14 * tokens.len() + 22)).max(720) as u32;
    let height = PANEL_HEIGHT * groups.len().max(1) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let panels = root.split_evenly((groups.len().max(1), 1));
        for (g, area) in groups.iter().zip(&panels) {
            panel(g, tokens, area).map_err(|e| format!("{}: {e}", g.title()))?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn panel(
    g: &Group,
    tokens: &[usize],
    area: &Area,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    let values: Vec<f64> = g
        .rows
        .iter()
        .flat_map(|r| r.cells.iter().flatten().map(|c| c.ps_per_bit))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0, f64::max);
    let (lo, hi) = if values.is_empty() {
        (0.1, 1.0)
    } else {
        (lo / 2.0, hi * 5.0)
    };
    let n = g.rows.len().max(1);
    let names: Vec<&str> = g.rows.iter().map(|r| r.ty.name()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{}: ps per bit and token (lower is better)", g.title()),
            ("sans-serif", 16),
        )
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..n as f64, (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("ps / (bit · token)")
        .y_labels(8)
        .y_label_formatter(&|y| {
            let s = format!("{y:.3}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        })
        .draw()?;
    let bar = 0.8 / tokens.len().max(1) as f64;
    for (s, &t) in tokens.iter().enumerate() {
        let colour = COLOURS[s % COLOURS.len()];
        let bars = g.rows.iter().enumerate().filter_map(|(i, r)| {
            let v = r.cells.get(s)?.as_ref()?.ps_per_bit;
            let x0 = i as f64 + 0.1 + s as f64 * bar;
            (v.is_finite() && v > 0.0)
                .then(|| Rectangle::new([(x0, lo), (x0 + bar * 0.9, v)], colour.filled()))
        });
        chart
            .draw_series(bars)?
            .label(format!("t{t}"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    // The type names under their bar groups (plotters' axis labels sit on
    // its own key points, not on categories).
    let style = TextStyle::from(("sans-serif", 12)).pos(Pos::new(HPos::Center, VPos::Top));
    let base = area.get_base_pixel();
    for (i, name) in names.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, lo));
        area.draw(&Text::new(
            name.to_string(),
            (px - base.0, py - base.1 + 6),
            style.clone(),
        ))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

/// Writes the chart to `path`.
pub(crate) fn write(path: &Path, groups: &[Group], tokens: &[usize]) -> anyhow::Result<()> {
    let svg = render(groups, tokens).map_err(anyhow::Error::msg)?;
    std::fs::write(path, svg)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::survey_table::{rank, Measured, Shape};
    use longhaul::tensor::GgmlType;

    #[test]
    fn the_chart_has_one_bar_per_cell_and_the_types_in_rank_order() {
        let shapes = [Shape::new("gate/up", 256, 64)];
        let m = |ty, n_tok, ns: f64| Measured {
            placement: "CPU".into(),
            threads: Some(1),
            shape: 0,
            ty,
            kernel: "scalar".into(),
            n_tok,
            ns: vec![ns],
        };
        let ms = vec![
            m(GgmlType::Q4_K, 1, 900.0),
            m(GgmlType::Q4_K, 8, 2000.0),
            m(GgmlType::Q8_0, 1, 100.0),
            m(GgmlType::Q8_0, 8, 500.0),
            m(GgmlType::F32, 1, 50.0),
        ];
        let groups = rank(&ms, &shapes, &[1, 8], 1);
        let svg = render(&groups, &[1, 8]).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        // plotters writes a text element's content on its own line.
        let pos = |s: &str| {
            svg.find(&format!("\n{s}\n</text>"))
                .unwrap_or_else(|| panic!("{s}"))
        };
        // Rank order at t1: F32 (least per bit), Q8_0, Q4_K.
        assert!(
            pos("f32") < pos("q8_0") && pos("q8_0") < pos("q4_K"),
            "{svg}"
        );
        assert!(svg.contains("\nt1\n</text>") && svg.contains("\nt8\n</text>"));
        // The five bars are filled with the two token counts' colours.
        let fill = |c: RGBColor| format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
        let bars = |c| svg.matches(&fill(c)).count();
        // Each colour also fills its legend swatch.
        assert_eq!(bars(COLOURS[0]), 3 + 1, "{svg}");
        assert_eq!(bars(COLOURS[1]), 2 + 1, "{svg}");
    }
}

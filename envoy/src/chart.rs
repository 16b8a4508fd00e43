//! Horizontal bar charts as SVG for the benchmark results in BENCHMARKS.md
//! (`make bench-envoy`, `make bench`). Written by hand: a plotting crate
//! would cost more to build than these few shapes, and the output is plain,
//! deterministic text that diffs well.
//!
//! A chart has one row per case and one or more panels side by side (say
//! throughput, then latency); a panel has one bar per series (say p50 and
//! p99) in every row, on its own linear scale from zero.

use crate::Result;
use std::fmt::Write as _;
use std::path::Path;

/// One bar per row in a panel.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    /// An SVG colour.
    pub color: String,
    /// The bar of each row; `None`: no bar in that row.
    pub values: Vec<Option<f64>>,
    /// The text beside each bar (the value, a ratio…); empty: the value.
    pub labels: Vec<String>,
}

impl Series {
    pub fn new(name: &str, color: &str, values: Vec<Option<f64>>) -> Series {
        Series {
            name: name.into(),
            color: color.into(),
            values,
            labels: Vec::new(),
        }
    }

    pub fn labels(mut self, labels: Vec<String>) -> Series {
        self.labels = labels;
        self
    }
}

#[derive(Debug, Clone)]
pub struct Panel {
    /// Above the panel, e.g. "throughput (req/s, higher is better)".
    pub title: String,
    pub series: Vec<Series>,
}

#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    /// One line under the title: what was run, where.
    pub subtitle: String,
    /// The case of each row, top to bottom.
    pub rows: Vec<String>,
    pub panels: Vec<Panel>,
}

/// Colours that stay apart for colour-blind readers (Okabe-Ito).
pub const BLUE: &str = "#0072B2";
pub const ORANGE: &str = "#E69F00";
pub const GREEN: &str = "#009E73";
pub const VERMILLION: &str = "#D55E00";

const FONT: &str = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";
const MARGIN: f64 = 16.0;
/// Width of one character of 12 px text, a little generous (DejaVu Sans
/// averages about 6.8 px): the SVG is laid out without measuring text.
const CHAR_WIDTH: f64 = 7.0;
/// The narrowest column of row labels.
const MIN_ROW_LABEL_WIDTH: f64 = 120.0;
const PANEL_WIDTH: f64 = 330.0;
const PANEL_GAP: f64 = 30.0;
/// Room right of the longest bar for its label.
const LABEL_ROOM: f64 = 110.0;
const BAR_HEIGHT: f64 = 15.0;
const ROW_GAP: f64 = 12.0;

impl Chart {
    /// The chart as a standalone SVG document.
    pub fn svg(&self) -> String {
        let series_per_row = self
            .panels
            .iter()
            .map(|p| p.series.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let row_height = series_per_row as f64 * BAR_HEIGHT + ROW_GAP;
        let legend = self.panels.iter().any(|p| p.series.len() > 1);
        // Title, subtitle, panel titles, legends (if any), then the rows.
        let panel_title_y = MARGIN + 60.0;
        let top = panel_title_y + if legend { 34.0 } else { 14.0 };
        let plot_height = self.rows.len() as f64 * row_height;
        let longest_row = self.rows.iter().map(|r| r.chars().count()).max();
        let label_width =
            (longest_row.unwrap_or(0) as f64 * CHAR_WIDTH + 10.0).max(MIN_ROW_LABEL_WIDTH);
        let plots = self.panels.len() as f64 * (PANEL_WIDTH + PANEL_GAP) - PANEL_GAP;
        // Wide enough for the rows and panels, and for the subtitle.
        let width = (MARGIN * 2.0 + label_width + plots)
            .max(MARGIN * 2.0 + self.subtitle.chars().count() as f64 * CHAR_WIDTH * 0.95);
        let height = top + plot_height + 34.0 + MARGIN;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" {FONT} font-size=\"12\">"
        );
        let _ = writeln!(
            s,
            "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n\
             <text x=\"{MARGIN}\" y=\"{:.1}\" font-size=\"15\" font-weight=\"bold\">{}</text>\n\
             <text x=\"{MARGIN}\" y=\"{:.1}\" fill=\"#555555\">{}</text>",
            MARGIN + 14.0,
            escape(&self.title),
            MARGIN + 32.0,
            escape(&self.subtitle)
        );
        // Row labels, right-aligned against the first panel.
        for (i, row) in self.rows.iter().enumerate() {
            let y = top + i as f64 * row_height + (row_height - ROW_GAP) / 2.0 + 4.0;
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{y:.1}\" text-anchor=\"end\">{}</text>",
                MARGIN + label_width - 10.0,
                escape(row)
            );
        }
        for (p, panel) in self.panels.iter().enumerate() {
            let x0 = MARGIN + label_width + p as f64 * (PANEL_WIDTH + PANEL_GAP);
            self.panel(
                &mut s,
                panel,
                x0,
                panel_title_y,
                top,
                row_height,
                plot_height,
            );
        }
        s.push_str("</svg>\n");
        s
    }

    #[allow(clippy::too_many_arguments)]
    fn panel(
        &self,
        s: &mut String,
        panel: &Panel,
        x0: f64,
        title_y: f64,
        top: f64,
        row_height: f64,
        plot_height: f64,
    ) {
        let bar_room = PANEL_WIDTH - LABEL_ROOM;
        let max = panel
            .series
            .iter()
            .flat_map(|se| se.values.iter().flatten())
            .copied()
            .filter(|v| v.is_finite())
            .fold(0.0_f64, f64::max);
        let (scale_max, step) = nice_scale(max);
        let px = |v: f64| x0 + bar_room * (v / scale_max).clamp(0.0, 1.0);
        let _ = writeln!(
            s,
            "<text x=\"{x0:.1}\" y=\"{title_y:.1}\" font-weight=\"bold\">{}</text>",
            escape(&panel.title)
        );
        if panel.series.len() > 1 {
            let mut lx = x0;
            for se in &panel.series {
                let _ = writeln!(
                    s,
                    "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"10\" fill=\"{}\"/>\
                     <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                    top - 18.0,
                    se.color,
                    lx + 16.0,
                    top - 9.0,
                    escape(&se.name)
                );
                lx += 24.0 + 7.0 * se.name.chars().count() as f64;
            }
        }
        // Grid lines and the scale under the plot.
        let mut tick = 0.0;
        while tick <= scale_max * 1.0001 {
            let x = px(tick);
            let _ = writeln!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{top:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#dddddd\"/>\
                 <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555555\" font-size=\"10\">{}</text>",
                top + plot_height,
                top + plot_height + 14.0,
                tick_label(tick, step)
            );
            tick += step;
        }
        for (i, _) in self.rows.iter().enumerate() {
            for (k, se) in panel.series.iter().enumerate() {
                let Some(v) = se.values.get(i).copied().flatten() else {
                    continue;
                };
                let y = top + i as f64 * row_height + k as f64 * BAR_HEIGHT;
                let w = (px(v) - x0).max(0.5);
                let label = se
                    .labels
                    .get(i)
                    .filter(|l| !l.is_empty())
                    .cloned()
                    .unwrap_or_else(|| number(v));
                let _ = writeln!(
                    s,
                    "<rect x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}: {}</title></rect>\
                     <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>",
                    BAR_HEIGHT - 2.0,
                    se.color,
                    escape(&se.name),
                    escape(&label),
                    x0 + w + 4.0,
                    y + BAR_HEIGHT - 4.0,
                    escape(&label)
                );
            }
        }
        let _ = writeln!(
            s,
            "<line x1=\"{x0:.1}\" y1=\"{top:.1}\" x2=\"{x0:.1}\" y2=\"{:.1}\" stroke=\"#333333\"/>",
            top + plot_height
        );
    }

    /// Write the SVG to `path` (its directory is created).
    pub fn write(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, self.svg())?;
        Ok(())
    }
}

/// A scale from 0 that ends on a round number at or above `max`, and the
/// step between its 4-6 grid lines.
pub fn nice_scale(max: f64) -> (f64, f64) {
    if max <= 0.0 || !max.is_finite() {
        return (1.0, 0.25);
    }
    let magnitude = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        let step = m * magnitude / 5.0;
        let top = (max / step).ceil() * step;
        if top / step <= 6.0 {
            return (top, step);
        }
    }
    (10.0 * magnitude, 2.0 * magnitude)
}

/// A grid line's value, with as many decimals as the step needs.
fn tick_label(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A value for a label: no more digits than a reader needs.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        Chart {
            title: "load <test> & more".into(),
            subtitle: "sub".into(),
            rows: vec!["a".into(), "b".into()],
            panels: vec![
                Panel {
                    title: "req/s".into(),
                    series: vec![Series::new("req/s", BLUE, vec![Some(100.0), Some(50.0)])],
                },
                Panel {
                    title: "ms".into(),
                    series: vec![
                        Series::new("p50", BLUE, vec![Some(1.0), None]),
                        Series::new("p99", ORANGE, vec![Some(4.0), Some(2.0)])
                            .labels(vec!["4 ms".into(), String::new()]),
                    ],
                },
            ],
        }
    }

    #[test]
    fn bars_are_proportional_and_text_is_escaped() {
        let svg = chart().svg();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("load &lt;test&gt; &amp; more"));
        assert!(!svg.contains("<test>"));
        // 100 fills the scale (bar_room = 238 px), 50 half of it.
        let widths: Vec<f64> = svg
            .split("width=\"")
            .skip(1)
            .filter_map(|w| w.split('"').next()?.parse().ok())
            .collect();
        let bar_room = PANEL_WIDTH - LABEL_ROOM;
        assert!(widths.contains(&bar_room), "{widths:?}");
        assert!(widths.contains(&(bar_room / 2.0)), "{widths:?}");
        // Three bars in the second panel (one None), labelled.
        assert_eq!(svg.matches("<title>p99: ").count(), 2);
        assert_eq!(svg.matches("<title>p50: ").count(), 1);
        assert!(svg.contains(">4 ms</text>"));
        assert!(svg.contains(">2.00</text>"));
        // Deterministic.
        assert_eq!(svg, chart().svg());
    }

    #[test]
    fn scales_end_on_round_numbers() {
        assert_eq!(nice_scale(11682.0), (12000.0, 2000.0));
        assert_eq!(nice_scale(9.44), (10.0, 2.0));
        assert_eq!(nice_scale(460.0), (500.0, 100.0));
        assert_eq!(nice_scale(0.0), (1.0, 0.25));
        assert_eq!(number(5532.4), "5532");
        assert_eq!(number(20.34), "20.3");
        assert_eq!(number(2.671), "2.67");
    }
}

//! Paper figures as SVG strings: ablation bars, an UpSet plot of which instances each approach
//! solves, and success against cost. Pure: plain data in, a standalone `<svg>` document out.
//!
//! Drawn with plotters' SVG backend only. Text goes out as SVG `<text>` elements that the
//! viewer lays out, so no font files are read at build or run time (plotters' `ttf` and
//! `ab_glyph` features stay off; its layout estimate is a fixed per-character width).

use plotters::coord::Shift;
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::{BTreeMap, BTreeSet};

/// Fill of the full agent's bar (the reference the ablations are read against).
const FULL_AGENT: RGBColor = RGBColor(0x1F, 0x4E, 0x79);
/// Fill of every other ablation bar.
const VARIANT: RGBColor = RGBColor(0x7F, 0xA7, 0xD1);
/// UpSet: intersection bars, member dots and the lines joining them.
const INK: RGBColor = RGBColor(0x33, 0x33, 0x33);
/// UpSet: the dot of a set that is not part of an intersection.
const ABSENT: RGBColor = RGBColor(0xD4, 0xD4, 0xD4);
/// UpSet: set-size bars.
const SET_SIZE: RGBColor = RGBColor(0x5B, 0x7F, 0xA6);
/// UpSet: shading of every other matrix row.
const ROW_SHADE: RGBColor = RGBColor(0xF3, 0xF3, 0xF3);
/// Grid lines.
const GRID: RGBColor = RGBColor(0xE0, 0xE0, 0xE0);
/// Scatter points, in turn (colour-blind-safe Okabe–Ito order).
const POINTS: [RGBColor; 8] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x00, 0x00, 0x00),
    RGBColor(0xF0, 0xE4, 0x42),
];
/// UpSet plots show at most this many intersections (the largest); the title says so.
pub const UPSET_MAX_INTERSECTIONS: usize = 40;

const FONT: &str = "sans-serif";
// plotters writes `font-size` as size / 1.24, so these are 17.7, 12.9 and 11.3 px.
const TITLE_SIZE: f64 = 22.0;
const LABEL_SIZE: f64 = 16.0;
const TICK_SIZE: f64 = 14.0;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// Success rate (%) per variant as horizontal bars, top to bottom in the given order (put the
/// full agent first: its bar is drawn darker), each labelled with its value. NaN shows as `n/a`.
pub fn ablation_bars(title: &str, bars: &[(String, f64)]) -> String {
    if bars.is_empty() {
        return no_data(title);
    }
    let n = bars.len();
    let name_w = label_width(bars.iter().map(|(name, _)| name.as_str()));
    let x_max = bars
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| v.is_finite())
        .fold(100.0, f64::max);
    let height = 120 + 34 * n as u32;
    svg((760, height), |root| {
        let area = root.titled(title, (FONT, TITLE_SIZE))?;
        let mut chart = ChartBuilder::on(&area)
            .margin_left(10)
            .margin_right(60) // room for the label of a 100 % bar
            .margin_top(6)
            .margin_bottom(6)
            .y_label_area_size(name_w)
            .x_label_area_size(48)
            .build_cartesian_2d(0.0..x_max, 0.0..n as f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(6)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .x_desc("Success rate (%)")
            .bold_line_style(GRID)
            .light_line_style(TRANSPARENT)
            .label_style((FONT, TICK_SIZE))
            .axis_desc_style((FONT, LABEL_SIZE))
            .draw()?;
        let row = |i: usize| (n - i) as f64 - 0.5; // first bar on top
        chart.draw_series(
            bars.iter()
                .enumerate()
                .filter(|(_, (_, v))| v.is_finite())
                .map(|(i, (_, v))| {
                    let fill = if i == 0 { FULL_AGENT } else { VARIANT };
                    Rectangle::new(
                        [(0.0, row(i) - 0.34), (v.max(0.0), row(i) + 0.34)],
                        fill.filled(),
                    )
                }),
        )?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let (end, value) = if v.is_finite() {
                (v.max(0.0), format!("{v:.1}"))
            } else {
                (0.0, "n/a".into())
            };
            EmptyElement::at((end, row(i))) + Text::new(value, (5, 0), text(LABEL_SIZE, HPos::Left))
        }))?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (name, _))| {
            EmptyElement::at((0.0, row(i)))
                + Text::new(name.clone(), (-8, 0), text(LABEL_SIZE, HPos::Right))
        }))?;
        Ok(())
    })
}

/// One exclusive intersection of an UpSet plot: the members in exactly these sets and no other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intersection {
    /// Indices into the input sets, ascending.
    pub sets: Vec<usize>,
    /// The members, sorted.
    pub members: Vec<String>,
}

/// The non-empty exclusive intersections of `sets`: largest first, then fewer sets first, then
/// by set indices. Every member of the union lands in exactly one intersection.
pub fn upset_intersections(sets: &[(String, BTreeSet<String>)]) -> Vec<Intersection> {
    let mut by_membership: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, (_, members)) in sets.iter().enumerate() {
        for m in members {
            by_membership.entry(m.as_str()).or_default().push(i);
        }
    }
    let mut groups: BTreeMap<Vec<usize>, Vec<String>> = BTreeMap::new();
    for (member, in_sets) in by_membership {
        groups.entry(in_sets).or_default().push(member.to_string());
    }
    let mut out: Vec<Intersection> = groups
        .into_iter()
        .map(|(sets, members)| Intersection { sets, members })
        .collect();
    out.sort_by(|a, b| {
        b.members
            .len()
            .cmp(&a.members.len())
            .then(a.sets.len().cmp(&b.sets.len()))
            .then_with(|| a.sets.cmp(&b.sets))
    });
    out
}

/// UpSet plot of solved instances: intersection sizes as bars on top, below them the matrix of
/// which sets (approaches, top to bottom in the given order) take part, set sizes on the right.
/// Shows the [`UPSET_MAX_INTERSECTIONS`] largest intersections.
pub fn upset(title: &str, sets: &[(String, BTreeSet<String>)]) -> String {
    let all = upset_intersections(sets);
    if all.is_empty() {
        return no_data(title);
    }
    let shown = &all[..all.len().min(UPSET_MAX_INTERSECTIONS)];
    let title = if shown.len() < all.len() {
        format!(
            "{title} (largest {} of {} intersections)",
            shown.len(),
            all.len()
        )
    } else {
        title.to_string()
    };
    let (m, k) = (sets.len(), shown.len());
    let name_w = label_width(sets.iter().map(|(name, _)| name.as_str())).max(90);
    let (col_w, row_h, side_w, top_h, axis_h) = (28, 26, 210, 230, 48);
    let main_w = name_w + 20 + col_w * k as u32;
    let width = main_w + side_w;
    let height = 40 + top_h + 8 + row_h * m as u32 + axis_h;
    let top_max = shown.iter().map(|i| i.members.len()).max().unwrap_or(0) as i32;
    let set_max = sets.iter().map(|(_, s)| s.len()).max().unwrap_or(0) as i32;

    svg((width, height), |root| {
        let area = root.titled(&title, (FONT, TITLE_SIZE))?;
        let (upper, lower) = area.split_vertically(top_h);
        let (upper_main, _) = upper.split_horizontally(main_w);
        let (lower_main, lower_side) = lower.split_horizontally(main_w);

        // Intersection sizes; its x range lines up with the matrix below (same width and margins).
        let mut bars = ChartBuilder::on(&upper_main)
            .margin_left(10)
            .margin_right(10)
            .margin_top(8)
            .y_label_area_size(name_w)
            .build_cartesian_2d(0.0..k as f64, 0..top_max + top_max / 8 + 1)?;
        bars.configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(5)
            .bold_line_style(GRID)
            .light_line_style(TRANSPARENT)
            .label_style((FONT, TICK_SIZE))
            .axis_desc_style((FONT, LABEL_SIZE))
            .draw()?;
        bars.draw_series(shown.iter().enumerate().map(|(j, s)| {
            let size = s.members.len() as i32;
            Rectangle::new(
                [(j as f64 + 0.15, 0), (j as f64 + 0.85, size)],
                INK.filled(),
            )
        }))?;
        // The axis title sits by the axis, not at the far edge of the wide label area (plotters'
        // `y_desc` would put it there).
        let rotated = text(LABEL_SIZE, HPos::Center).transform(FontTransform::Rotate270);
        let middle = (0.0, (top_max + top_max / 8 + 1) / 2);
        bars.plotting_area().draw(
            &(EmptyElement::at(middle) + Text::new("Intersection size", (-42, 0), rotated)),
        )?;
        bars.draw_series(shown.iter().enumerate().map(|(j, s)| {
            let style = text(TICK_SIZE, HPos::Center).pos(Pos::new(HPos::Center, VPos::Bottom));
            Text::new(
                s.members.len().to_string(),
                (j as f64 + 0.5, s.members.len() as i32),
                style,
            )
        }))?;

        // The matrix: one row per set, one column per intersection.
        let row = |i: usize| (m - i) as f64 - 0.5;
        let mut matrix = ChartBuilder::on(&lower_main)
            .margin_left(10)
            .margin_right(10)
            .margin_top(8)
            .y_label_area_size(name_w)
            .x_label_area_size(axis_h)
            .build_cartesian_2d(0.0..k as f64, 0.0..m as f64)?;
        matrix.draw_series((0..m).filter(|i| i % 2 == 0).map(|i| {
            Rectangle::new(
                [(0.0, row(i) - 0.5), (k as f64, row(i) + 0.5)],
                ROW_SHADE.filled(),
            )
        }))?;
        matrix.draw_series(
            shown
                .iter()
                .enumerate()
                .filter(|(_, s)| s.sets.len() > 1)
                .map(|(j, s)| {
                    let x = j as f64 + 0.5;
                    let (first, last) = (s.sets[0], s.sets[s.sets.len() - 1]);
                    PathElement::new(vec![(x, row(first)), (x, row(last))], INK.stroke_width(3))
                }),
        )?;
        matrix.draw_series(shown.iter().enumerate().flat_map(|(j, s)| {
            (0..m).map(move |i| {
                let colour = if s.sets.contains(&i) { INK } else { ABSENT };
                Circle::new((j as f64 + 0.5, row(i)), 7, colour.filled())
            })
        }))?;
        matrix.draw_series(sets.iter().enumerate().map(|(i, (name, _))| {
            EmptyElement::at((0.0, row(i)))
                + Text::new(name.clone(), (-10, 0), text(LABEL_SIZE, HPos::Right))
        }))?;

        // Set sizes, rows aligned with the matrix (same height, top margin and axis area).
        let mut sizes = ChartBuilder::on(&lower_side)
            .margin_left(12)
            .margin_right(40)
            .margin_top(8)
            .x_label_area_size(axis_h)
            .build_cartesian_2d(0..set_max + set_max / 10 + 1, 0.0..m as f64)?;
        sizes
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(4)
            .x_desc("Set size")
            .bold_line_style(GRID)
            .light_line_style(TRANSPARENT)
            .label_style((FONT, TICK_SIZE))
            .axis_desc_style((FONT, LABEL_SIZE))
            .draw()?;
        sizes.draw_series(
            sets.iter()
                .enumerate()
                .filter(|(_, (_, s))| !s.is_empty())
                .map(|(i, (_, s))| {
                    Rectangle::new(
                        [(0, row(i) - 0.3), (s.len() as i32, row(i) + 0.3)],
                        SET_SIZE.filled(),
                    )
                }),
        )?;
        sizes.draw_series(sets.iter().enumerate().map(|(i, (_, s))| {
            EmptyElement::at((s.len() as i32, row(i)))
                + Text::new(s.len().to_string(), (4, 0), text(TICK_SIZE, HPos::Left))
        }))?;
        Ok(())
    })
}

/// Success rate (%) against cost per task ($), one labelled point per approach. Points with a
/// non-finite coordinate are left out.
pub fn success_vs_cost(title: &str, points: &[(String, f64, f64)]) -> String {
    let finite: Vec<&(String, f64, f64)> = points
        .iter()
        .filter(|(_, c, s)| c.is_finite() && s.is_finite())
        .collect();
    if finite.is_empty() {
        return no_data(title);
    }
    let cost_max = finite.iter().map(|p| p.1).fold(0.0, f64::max);
    let x_max = if cost_max > 0.0 { cost_max * 1.15 } else { 1.0 };
    let y_max = finite.iter().map(|p| p.2).fold(100.0, f64::max);
    let decimals = if x_max >= 10.0 {
        1
    } else if x_max >= 0.1 {
        2
    } else {
        4
    };
    // A little room below zero keeps points at 0 $ or 0 % off the axes.
    let (x_min, y_min) = (-0.03 * x_max, -0.03 * y_max);
    svg((760, 480), |root| {
        let area = root.titled(title, (FONT, TITLE_SIZE))?;
        let mut chart = ChartBuilder::on(&area)
            .margin_left(10)
            .margin_right(30)
            .margin_top(6)
            .y_label_area_size(64)
            .x_label_area_size(48)
            .build_cartesian_2d(x_min..x_max, y_min..y_max)?;
        chart
            .configure_mesh()
            .x_labels(6)
            .y_labels(6)
            .x_label_formatter(&|v| format!("{v:.decimals$}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .x_desc("Cost per task ($)")
            .y_desc("Success rate (%)")
            .bold_line_style(GRID)
            .light_line_style(TRANSPARENT)
            .label_style((FONT, TICK_SIZE))
            .axis_desc_style((FONT, LABEL_SIZE))
            .draw()?;
        chart.draw_series(
            finite
                .iter()
                .enumerate()
                .map(|(i, (label, cost, success))| {
                    // Labels go right of the point, or left of it near the right edge.
                    let (dx, h) = if *cost > 0.7 * x_max {
                        (-9, HPos::Right)
                    } else {
                        (9, HPos::Left)
                    };
                    EmptyElement::at((*cost, *success))
                        + Circle::new((0, 0), 5, POINTS[i % POINTS.len()].filled())
                        + Text::new(label.clone(), (dx, 0), text(LABEL_SIZE, h))
                }),
        )?;
        Ok(())
    })
}

/// A figure with only its title and "no data", for empty inputs.
fn no_data(title: &str) -> String {
    svg((760, 160), |root| {
        let area = root.titled(title, (FONT, TITLE_SIZE))?;
        let (w, h) = area.dim_in_pixel();
        area.draw(&Text::new(
            "no data",
            (w as i32 / 2, h as i32 / 2),
            text(LABEL_SIZE, HPos::Center),
        ))?;
        Ok(())
    })
}

/// Draws into a fresh SVG document of `size` pixels on a white background.
fn svg(size: (u32, u32), draw: impl FnOnce(&Area<'_>) -> Drawn) -> String {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE)
            .and_then(|()| draw(&root))
            .and_then(|()| root.present())
            // The backend writes into a String and the fallback font only estimates sizes.
            .expect("drawing an SVG into a String cannot fail");
    }
    out.truncate(out.trim_end().len());
    out
}

/// A label style anchored horizontally at `h` and vertically centred.
fn text(size: f64, h: HPos) -> TextStyle<'static> {
    (FONT, size)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(h, VPos::Center))
}

/// Pixels for a column of labels (plotters' estimate is ~0.46 em per byte at `LABEL_SIZE`).
fn label_width<'a>(labels: impl Iterator<Item = &'a str>) -> u32 {
    let chars = labels.map(|l| l.chars().count()).max().unwrap_or(0) as u32;
    (chars * 15 / 2 + 20).clamp(60, 320)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(c: RGBColor) -> String {
        format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2)
    }

    fn check_svg(svg: &str, labels: &[&str]) {
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<svg").count(), 1);
        for l in labels {
            assert!(
                svg.contains(&format!(">\n{l}\n</text>")),
                "no label `{l}` in {svg}"
            );
        }
    }

    fn sets(spec: &[(&str, &[&str])]) -> Vec<(String, BTreeSet<String>)> {
        spec.iter()
            .map(|(name, members)| {
                (
                    name.to_string(),
                    members.iter().map(|m| m.to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn ablation_bars_draws_one_labelled_bar_per_variant() {
        let bars = vec![
            ("full".to_string(), 58.43),
            ("w/o feedback".to_string(), 41.0),
            ("w/o localization <&>".to_string(), 100.0),
            ("broken".to_string(), f64::NAN),
        ];
        let svg = ablation_bars("Ablation on SWT-bench", &bars);
        check_svg(
            &svg,
            &[
                "Ablation on SWT-bench",
                "full",
                "w/o feedback",
                "w/o localization &lt;&amp;&gt;",
                "58.4",
                "41.0",
                "100.0",
                "n/a",
            ],
        );
        assert_eq!(svg.matches(&fill(FULL_AGENT)).count(), 1);
        assert_eq!(svg.matches(&fill(VARIANT)).count(), 2, "no bar for NaN");
        assert!(!svg.contains("<&>"));
    }

    #[test]
    fn intersections_are_exclusive_and_largest_first() {
        let s = sets(&[
            ("A", &["1", "2", "3", "4"]),
            ("B", &["3", "4", "5"]),
            ("C", &["4", "6"]),
            ("D", &[]),
        ]);
        let all = upset_intersections(&s);
        let got: Vec<(Vec<usize>, Vec<&str>)> = all
            .iter()
            .map(|i| {
                (
                    i.sets.clone(),
                    i.members.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        let want: Vec<(Vec<usize>, Vec<&str>)> = vec![
            (vec![0], vec!["1", "2"]),
            (vec![1], vec!["5"]),
            (vec![2], vec!["6"]),
            (vec![0, 1], vec!["3"]),
            (vec![0, 1, 2], vec!["4"]),
        ];
        assert_eq!(got, want);
        assert_eq!(
            upset_intersections(&sets(&[("A", &[]), ("B", &[])])),
            vec![]
        );
        assert_eq!(upset_intersections(&[]), vec![]);
        // Identical sets: one intersection holding everything.
        let same = upset_intersections(&sets(&[("A", &["x", "y"]), ("B", &["y", "x"])]));
        assert_eq!(
            same,
            vec![Intersection {
                sets: vec![0, 1],
                members: vec!["x".into(), "y".into()]
            }]
        );
    }

    #[test]
    fn upset_draws_bars_matrix_and_set_sizes() {
        let s = sets(&[
            ("ours", &["1", "2", "3", "4"]),
            ("baseline", &["3", "4", "5"]),
            ("oracle", &["4", "6"]),
            ("none", &[]),
        ]);
        let svg = upset("Solved instances", &s);
        check_svg(
            &svg,
            &[
                "Solved instances",
                "ours",
                "baseline",
                "oracle",
                "none",
                "Intersection size",
                "Set size",
            ],
        );
        // 5 intersections: 5 bars, 4 x 5 dots of which 1+1+1+2+3 are filled, 3 non-empty set bars.
        assert_eq!(svg.matches("<circle").count(), 20);
        assert_eq!(
            svg.matches(&fill(INK)).count(),
            5 + 8,
            "bars and filled dots"
        );
        assert_eq!(svg.matches(&fill(ABSENT)).count(), 12);
        assert_eq!(svg.matches(&fill(SET_SIZE)).count(), 3);
        assert_eq!(upset("Empty", &sets(&[("a", &[])])), no_data("Empty"));
    }

    #[test]
    fn upset_caps_the_number_of_intersections() {
        // 7 sets give 127 possible intersections; make each non-empty.
        let s: Vec<(String, BTreeSet<String>)> = (0..7)
            .map(|i| {
                (
                    format!("s{i}"),
                    (1..128u32)
                        .filter(|m| m & (1 << i) != 0)
                        .map(|m| m.to_string())
                        .collect(),
                )
            })
            .collect();
        assert_eq!(upset_intersections(&s).len(), 127);
        let svg = upset("Many", &s);
        check_svg(&svg, &["Many (largest 40 of 127 intersections)"]);
        assert_eq!(svg.matches("<circle").count(), 7 * UPSET_MAX_INTERSECTIONS);
    }

    #[test]
    fn success_vs_cost_draws_one_labelled_dot_per_point() {
        let points = vec![
            ("ours".to_string(), 0.42, 58.4),
            ("baseline".to_string(), 0.10, 31.0),
            ("expensive".to_string(), 2.5, 60.0),
            ("unknown cost".to_string(), f64::NAN, 20.0),
        ];
        let svg = success_vs_cost("Success vs cost", &points);
        check_svg(
            &svg,
            &[
                "Success vs cost",
                "ours",
                "baseline",
                "expensive",
                "Cost per task ($)",
                "Success rate (%)",
            ],
        );
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(!svg.contains("unknown cost"));
    }

    #[test]
    fn empty_inputs_give_a_titled_placeholder() {
        for svg in [
            ablation_bars("A", &[]),
            upset("B", &[]),
            success_vs_cost("C", &[]),
        ] {
            check_svg(&svg, &["no data"]);
        }
    }
}

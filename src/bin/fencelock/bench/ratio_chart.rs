//! The report's first chart: each lock against its peer or ceiling, one bar per ratio
//! computed inside the run, with parity (1.0x) marked: the answer to "is it faster?".

use std::path::Path;

use plotters::prelude::*;

use super::BoxResult;

/// Where the axis ends: bars beyond it are cut, their value printed (a 20x contended
/// ratio would otherwise flatten every bar near parity).
const AXIS_MAX: f64 = 3.0;

const WIDTH: u32 = 1100;
const ROW: i32 = 26;
const TOP: i32 = 60;
const LABEL_WIDTH: i32 = 400;
const BAR_WIDTH: i32 = 520;

/// Draws `ratios` (label, value) as horizontal bars into an SVG at `path`; nothing when
/// there are none.
pub fn draw(path: &Path, ratios: &[(String, f64)]) -> BoxResult<()> {
    if ratios.is_empty() {
        return Ok(());
    }
    let ratios = grouped(ratios);
    let rows = i32::try_from(ratios.len()).unwrap_or(i32::MAX / ROW - 4);
    let height = u32::try_from(TOP + ROW * rows + 50).unwrap_or(800);
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let axis_max = axis_max(&ratios);
    let x = |value: f64| LABEL_WIDTH + scale(value, axis_max);
    root.draw(&Text::new(
        "Lock / peer cycles per second, same run (right of the line: the lock is faster)",
        (20, 15),
        ("sans-serif", 20),
    ))?;
    let bottom = TOP + ROW * rows;
    // Ticks every 0.5x, parity bold.
    let mut tick = 0.0;
    while tick <= axis_max + 1e-9 {
        let at = x(tick);
        let parity = (tick - 1.0).abs() < 1e-9;
        let style = if parity {
            BLACK.stroke_width(2)
        } else {
            RGBColor(210, 210, 210).stroke_width(1)
        };
        root.draw(&PathElement::new(vec![(at, TOP - 8), (at, bottom)], style))?;
        root.draw(&Text::new(
            format!("{tick:.1}x"),
            (at - 12, bottom + 8),
            ("sans-serif", 13),
        ))?;
        tick += 0.5;
    }
    for (i, (label, value)) in ratios.iter().enumerate() {
        let y = TOP + ROW * i32::try_from(i).unwrap_or(0);
        let color = if *value >= 1.0 {
            RGBColor(44, 160, 44)
        } else {
            RGBColor(255, 127, 14)
        };
        let end = x(value.min(axis_max));
        root.draw(&Rectangle::new(
            [(LABEL_WIDTH, y + 3), (end, y + ROW - 5)],
            color.filled(),
        ))?;
        let cut = if *value > axis_max { " >" } else { "" };
        // On white, so that the parity line does not cross the figure.
        root.draw(&Rectangle::new(
            [(end + 3, y + 3), (end + 62, y + ROW - 5)],
            WHITE.filled(),
        ))?;
        root.draw(&Text::new(
            format!("{value:.2}x{cut}"),
            (end + 6, y + 5),
            ("sans-serif", 14),
        ))?;
        root.draw(&Text::new(label.clone(), (10, y + 5), ("sans-serif", 14)))?;
    }
    root.present()?;
    Ok(())
}

/// The ratios with each pair's rows together (`etcd lock / etcd Lock RPC` at every
/// concurrency, then the next pair), in the order the pairs first appear.
fn grouped(ratios: &[(String, f64)]) -> Vec<(String, f64)> {
    let pair = |label: &str| {
        label
            .rsplit_once(", ")
            .map_or(label, |(pair, _)| pair)
            .to_owned()
    };
    let mut pairs: Vec<String> = Vec::new();
    for (label, _) in ratios {
        if !pairs.contains(&pair(label)) {
            pairs.push(pair(label));
        }
    }
    let mut out = ratios.to_vec();
    out.sort_by_key(|(label, _)| pairs.iter().position(|p| *p == pair(label)));
    out
}

/// The axis' end: the largest ratio, at least 1.5x (parity stays inside), at most
/// [`AXIS_MAX`], rounded up to a half.
fn axis_max(ratios: &[(String, f64)]) -> f64 {
    let largest = ratios.iter().map(|(_, v)| *v).fold(1.5, f64::max);
    (largest.min(AXIS_MAX) * 2.0).ceil() / 2.0
}

/// Pixels from the axis' start for `value` on an axis ending at `axis_max`.
fn scale(value: f64, axis_max: f64) -> i32 {
    #[allow(clippy::cast_possible_truncation)]
    let pixels = (value.max(0.0) / axis_max * f64::from(BAR_WIDTH)).round() as i32;
    pixels
}

#[cfg(test)]
mod tests {
    use super::{BAR_WIDTH, axis_max, scale};

    #[test]
    fn each_pairs_rows_stay_together() {
        let rows = |labels: &[&str]| -> Vec<(String, f64)> {
            labels.iter().map(|l| ((*l).to_owned(), 1.0)).collect()
        };
        let grouped = super::grouped(&rows(&[
            "a / b, c=1",
            "x / y, c=1",
            "a / b, c=8",
            "x / y, c=8",
        ]));
        let labels: Vec<&str> = grouped.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            ["a / b, c=1", "a / b, c=8", "x / y, c=1", "x / y, c=8"]
        );
    }

    #[test]
    fn the_axis_keeps_parity_and_cuts_outliers() {
        let r = |v: f64| vec![("x".to_owned(), v)];
        assert!((axis_max(&r(0.7)) - 1.5).abs() < 1e-9);
        assert!((axis_max(&r(2.2)) - 2.5).abs() < 1e-9);
        assert!((axis_max(&r(26.8)) - 3.0).abs() < 1e-9);
        assert_eq!(scale(3.0, 3.0), BAR_WIDTH);
        assert_eq!(scale(-1.0, 3.0), 0);
    }
}

//! Line charts: several series over one pair of axes, with ticks, a grid and a legend.

use super::canvas::{text_height, text_width, Canvas, Rgb, BLACK, GREY, TEXT_SCALE};
use super::ticks::{label, ticks};

/// Series colours, in order (a colour-blind-safe qualitative palette).
pub const PALETTE: [Rgb; 8] = [
    [0, 114, 178],
    [213, 94, 0],
    [0, 158, 115],
    [204, 121, 167],
    [230, 159, 0],
    [86, 180, 233],
    [120, 120, 120],
    [0, 0, 0],
];

/// How a series is drawn: joined points, or marks (sparse points such as validations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Line,
    Marks,
}

#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub color: Rgb,
    pub style: Style,
}

#[derive(Clone, Debug)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const WIDTH: usize = 960;
const HEIGHT: usize = 600;
/// Plot area margins: left for the y labels, bottom for the x labels, top for the title.
const LEFT: i64 = 90;
const RIGHT: i64 = 30;
const TOP: i64 = 50;
const BOTTOM: i64 = 70;

impl LineChart {
    /// Draws the chart; non-finite points are left out.
    pub fn draw(&self) -> Canvas {
        let legend_width = match self.series.is_empty() {
            true => 0,
            false => self.series.iter().map(|s| text_width(&s.label, TEXT_SCALE)).max().unwrap_or(0) + 50,
        };
        let mut canvas = Canvas::new(WIDTH + legend_width as usize, HEIGHT);
        let (x0, y0, x1, y1) = (LEFT, TOP, WIDTH as i64 - RIGHT, HEIGHT as i64 - BOTTOM);
        let finite: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        let (xs, ys) = (range(finite.iter().map(|p| p.0)), range(finite.iter().map(|p| p.1)));
        let (x_ticks, y_ticks) = (ticks(xs.0, xs.1), ticks(ys.0, ys.1));
        let (xs, ys) = (span(&x_ticks, xs), span(&y_ticks, ys));
        let to_px = |(x, y): (f64, f64)| {
            let px = x0 as f64 + (x - xs.0) / (xs.1 - xs.0) * (x1 - x0) as f64;
            let py = y1 as f64 - (y - ys.0) / (ys.1 - ys.0) * (y1 - y0) as f64;
            (px.round() as i64, py.round() as i64)
        };

        let title_x = (x0 + x1 - text_width(&self.title, TEXT_SCALE)) / 2;
        canvas.text(title_x, 15, &self.title, TEXT_SCALE, BLACK);
        for &t in &y_ticks {
            let (_, py) = to_px((xs.0, t));
            canvas.fill(x0, py, x1, py + 1, GREY);
            let text = label(t, &y_ticks);
            canvas.text(
                x0 - 8 - text_width(&text, TEXT_SCALE),
                py - text_height(TEXT_SCALE) / 2,
                &text,
                TEXT_SCALE,
                BLACK,
            );
        }
        for &t in &x_ticks {
            let (px, _) = to_px((t, ys.0));
            canvas.fill(px, y0, px + 1, y1, GREY);
            let text = label(t, &x_ticks);
            canvas.text(px - text_width(&text, TEXT_SCALE) / 2, y1 + 8, &text, TEXT_SCALE, BLACK);
        }
        canvas.fill(x0, y0, x0 + 2, y1 + 2, BLACK);
        canvas.fill(x0, y1, x1, y1 + 2, BLACK);
        let x_label_x = (x0 + x1 - text_width(&self.x_label, TEXT_SCALE)) / 2;
        canvas.text(x_label_x, HEIGHT as i64 - 28, &self.x_label, TEXT_SCALE, BLACK);
        canvas.text(8, 15, &self.y_label, TEXT_SCALE, BLACK);

        for series in &self.series {
            let points: Vec<(i64, i64)> =
                series.points.iter().filter(|(x, y)| x.is_finite() && y.is_finite()).map(|&p| to_px(p)).collect();
            match series.style {
                Style::Line => points.windows(2).for_each(|w| canvas.line(w[0], w[1], series.color)),
                Style::Marks => points.iter().for_each(|&(x, y)| canvas.fill(x - 3, y - 3, x + 4, y + 4, series.color)),
            }
            if let [(x, y)] = points[..] {
                canvas.fill(x - 3, y - 3, x + 4, y + 4, series.color);
            }
        }
        self.legend(&mut canvas, x1 + 10);
        canvas
    }

    /// The series' labels in a column right of the plot area, so that none covers the data.
    fn legend(&self, canvas: &mut Canvas, left: i64) {
        let line = text_height(TEXT_SCALE) + 8;
        let top = TOP;
        for (i, series) in self.series.iter().enumerate() {
            let y = top + 8 + i as i64 * line;
            canvas.fill(left + 8, y + 3, left + 26, y + 9, series.color);
            canvas.text(left + 32, y, &series.label, TEXT_SCALE, BLACK);
        }
    }
}

/// The smallest and largest of `values`; `(0, 1)` when there are none.
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values
        .fold(None, |r: Option<(f64, f64)>, v| Some(r.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v)))))
        .unwrap_or((0.0, 1.0))
}

/// The axis span: the data's range widened to its outer ticks.
fn span(ticks: &[f64], (lo, hi): (f64, f64)) -> (f64, f64) {
    let lo = ticks.first().map_or(lo, |t| t.min(lo));
    let hi = ticks.last().map_or(hi, |t| t.max(hi));
    if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, hi + 0.5)
    }
}

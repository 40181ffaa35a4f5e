//! Heat maps: a grid of shares in `[0, 1]` (the needle evaluation's accuracy per context length
//! and depth), each cell coloured from red (0) through yellow to green (1) and labelled with
//! its percentage.

use super::canvas::{text_height, text_width, Canvas, Rgb, BLACK, GREY, TEXT_SCALE};

#[derive(Clone, Debug)]
pub struct HeatMap {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub columns: Vec<String>,
    pub rows: Vec<String>,
    /// `values[row][column]`; `None` where nothing was measured.
    pub values: Vec<Vec<Option<f64>>>,
}

const CELL_HEIGHT: i64 = 44;
const MIN_CELL_WIDTH: i64 = 64;
const LEFT: i64 = 120;
const TOP: i64 = 60;
const MARGIN: i64 = 30;
const BOTTOM: i64 = 80;

impl HeatMap {
    pub fn draw(&self) -> Canvas {
        let columns = self.columns.len().max(1) as i64;
        let cell_width =
            self.columns.iter().map(|c| text_width(c, TEXT_SCALE) + 12).max().unwrap_or(0).max(MIN_CELL_WIDTH);
        let width = (LEFT + columns * cell_width + MARGIN).max(text_width(&self.title, TEXT_SCALE) + 2 * MARGIN);
        let height = TOP + self.rows.len() as i64 * CELL_HEIGHT + BOTTOM;
        let mut canvas = Canvas::new(width as usize, height as usize);
        canvas.text((width - text_width(&self.title, TEXT_SCALE)) / 2, 15, &self.title, TEXT_SCALE, BLACK);
        canvas.text(8, TOP - 22, &self.y_label, TEXT_SCALE, BLACK);

        for (r, row) in self.rows.iter().enumerate() {
            let y = TOP + r as i64 * CELL_HEIGHT;
            let label_y = y + (CELL_HEIGHT - text_height(TEXT_SCALE)) / 2;
            canvas.text(LEFT - 10 - text_width(row, TEXT_SCALE), label_y, row, TEXT_SCALE, BLACK);
            for c in 0..self.columns.len() {
                let x = LEFT + c as i64 * cell_width;
                let value = self.values.get(r).and_then(|v| v.get(c)).copied().flatten();
                let color = value.map_or(GREY, share_color);
                canvas.fill(x + 1, y + 1, x + cell_width - 1, y + CELL_HEIGHT - 1, color);
                let text = value.map_or("-".to_string(), |v| format!("{:.0}", v * 100.0));
                canvas.text(x + (cell_width - text_width(&text, TEXT_SCALE)) / 2, label_y, &text, TEXT_SCALE, BLACK);
            }
        }
        let below = TOP + self.rows.len() as i64 * CELL_HEIGHT + 8;
        for (c, column) in self.columns.iter().enumerate() {
            let x = LEFT + c as i64 * cell_width + (cell_width - text_width(column, TEXT_SCALE)) / 2;
            canvas.text(x, below, column, TEXT_SCALE, BLACK);
        }
        let x_label_x = LEFT + (columns * cell_width - text_width(&self.x_label, TEXT_SCALE)) / 2;
        canvas.text(x_label_x, below + text_height(TEXT_SCALE) + 16, &self.x_label, TEXT_SCALE, BLACK);
        canvas
    }
}

/// Red at 0, yellow at 0.5, green at 1.
pub fn share_color(share: f64) -> Rgb {
    let s = share.clamp(0.0, 1.0);
    let (red, green) = if s < 0.5 { (230.0, 80.0 + 300.0 * s) } else { (230.0 - 400.0 * (s - 0.5), 230.0) };
    [red as u8, green as u8, 90]
}

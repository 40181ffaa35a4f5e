//! An RGB pixel buffer with the few primitives the charts draw (rectangles, lines, text) and
//! its PNG encoding: charts without a plotting crate or a font rasteriser in the build.

use std::io::Write;

use flate2::write::ZlibEncoder;
use flate2::Compression;

use super::font;

pub type Rgb = [u8; 3];

pub const WHITE: Rgb = [255, 255, 255];
pub const BLACK: Rgb = [0, 0, 0];
pub const GREY: Rgb = [200, 200, 200];
/// Font pixels per glyph pixel of the charts' text.
pub const TEXT_SCALE: i64 = 2;

pub struct Canvas {
    pub width: usize,
    pub height: usize,
    pixels: Vec<Rgb>,
}

impl Canvas {
    pub fn new(width: usize, height: usize) -> Self {
        Canvas { width, height, pixels: vec![WHITE; width * height] }
    }

    pub fn pixel(&self, x: usize, y: usize) -> Rgb {
        self.pixels[y * self.width + x]
    }

    /// Sets a pixel; points off the canvas are dropped.
    pub fn set(&mut self, x: i64, y: i64, color: Rgb) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            self.pixels[y as usize * self.width + x as usize] = color;
        }
    }

    /// Fills `[x0, x1) x [y0, y1)`.
    pub fn fill(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, color: Rgb) {
        for y in y0..y1 {
            for x in x0..x1 {
                self.set(x, y, color);
            }
        }
    }

    /// A line two pixels wide from `(x0, y0)` to `(x1, y1)` (Bresenham's walk).
    pub fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), color: Rgb) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.fill(x, y, x + 2, y + 2, color);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Draws `text` with its top-left corner at `(x, y)`, each font pixel `scale` pixels wide.
    pub fn text(&mut self, x: i64, y: i64, text: &str, scale: i64, color: Rgb) {
        for (i, c) in text.chars().enumerate() {
            let left = x + i as i64 * text_advance(scale);
            for (row, bits) in font::glyph(c).iter().enumerate() {
                for col in 0..font::WIDTH {
                    if bits & (1 << (font::WIDTH - 1 - col)) != 0 {
                        let (px, py) = (left + col as i64 * scale, y + row as i64 * scale);
                        self.fill(px, py, px + scale, py + scale, color);
                    }
                }
            }
        }
    }

    /// The image as a PNG file (8-bit RGB, no interlace).
    pub fn png(&self) -> Vec<u8> {
        let mut rows = Vec::with_capacity(self.height * (1 + 3 * self.width));
        for line in self.pixels.chunks(self.width) {
            rows.push(0); // filter: none
            rows.extend(line.iter().flatten());
        }
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::default());
        zlib.write_all(&rows).expect("writing to memory");
        let data = zlib.finish().expect("writing to memory");

        let mut header = Vec::with_capacity(13);
        header.extend((self.width as u32).to_be_bytes());
        header.extend((self.height as u32).to_be_bytes());
        header.extend([8, 2, 0, 0, 0]); // bit depth 8, RGB, deflate, adaptive filters, no interlace
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        chunk(&mut png, b"IHDR", &header);
        chunk(&mut png, b"IDAT", &data);
        chunk(&mut png, b"IEND", &[]);
        png
    }
}

/// Horizontal pixels a character takes at `scale`.
pub fn text_advance(scale: i64) -> i64 {
    (font::WIDTH as i64 + 1) * scale
}

/// Width in pixels of `text` at `scale`.
pub fn text_width(text: &str, scale: i64) -> i64 {
    text.chars().count() as i64 * text_advance(scale)
}

/// Height in pixels of a line of text at `scale`.
pub fn text_height(scale: i64) -> i64 {
    font::HEIGHT as i64 * scale
}

fn chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    png.extend((data.len() as u32).to_be_bytes());
    let start = png.len();
    png.extend(kind);
    png.extend(data);
    let crc = crc32fast::hash(&png[start..]);
    png.extend(crc.to_be_bytes());
}

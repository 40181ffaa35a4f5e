//! `nsa plot`'s charts and the needle heat map: the PNG files decode to the drawn pixels, the
//! metrics of a run become the series they hold, and each series is drawn in its colour.

use std::io::Read;

use flate2::read::ZlibDecoder;
use nsa_train::needle::{heat_map, NeedleCell};
use nsa_train::plot::canvas::Rgb;
use nsa_train::plot::heat_map::share_color;
use nsa_train::plot::runs::{charts, RunMetrics};
use nsa_train::plot::{Canvas, LineChart, Series, Style};

use crate::common;

/// Decodes a PNG written by [`Canvas::png`]: checks the signature, every chunk's CRC and the
/// header, inflates the rows and returns the pixels.
fn decode(png: &[u8]) -> (usize, usize, Vec<Rgb>) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let (mut at, mut header, mut data) = (8, Vec::new(), Vec::new());
    while at < png.len() {
        let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
        let (kind, body) = (&png[at + 4..at + 8], &png[at + 8..at + 8 + len]);
        let crc = u32::from_be_bytes(png[at + 8 + len..at + 12 + len].try_into().unwrap());
        assert_eq!(crc, crc32fast::hash(&png[at + 4..at + 8 + len]), "CRC of {}", String::from_utf8_lossy(kind));
        match kind {
            b"IHDR" => header = body.to_vec(),
            b"IDAT" => data.extend_from_slice(body),
            _ => {}
        }
        at += 12 + len;
    }
    let width = u32::from_be_bytes(header[0..4].try_into().unwrap()) as usize;
    let height = u32::from_be_bytes(header[4..8].try_into().unwrap()) as usize;
    assert_eq!(&header[8..], &[8, 2, 0, 0, 0], "8-bit RGB");
    let mut rows = Vec::new();
    ZlibDecoder::new(&data[..]).read_to_end(&mut rows).unwrap();
    assert_eq!(rows.len(), height * (1 + 3 * width));
    let pixels = rows.chunks(1 + 3 * width).flat_map(|row| row[1..].chunks(3).map(|p| [p[0], p[1], p[2]])).collect();
    (width, height, pixels)
}

fn count(canvas: &Canvas, color: Rgb) -> usize {
    (0..canvas.height)
        .flat_map(|y| (0..canvas.width).map(move |x| (x, y)))
        .filter(|&(x, y)| canvas.pixel(x, y) == color)
        .count()
}

#[test]
fn a_chart_decodes_to_its_pixels_with_each_series_in_its_colour() {
    let (red, blue) = ([200, 0, 0], [0, 0, 200]);
    let chart = LineChart {
        title: "Loss".into(),
        x_label: "step".into(),
        y_label: "nats/token".into(),
        series: vec![
            Series { label: "a".into(), points: vec![(0.0, 5.0), (100.0, 2.0)], color: red, style: Style::Line },
            Series { label: "b".into(), points: vec![(50.0, 3.5), (f64::NAN, 1.0)], color: blue, style: Style::Marks },
        ],
    };
    let canvas = chart.draw();
    let (width, height, pixels) = decode(&canvas.png());
    assert_eq!((width, height), (canvas.width, canvas.height));
    let drawn: Vec<Rgb> =
        (0..height).flat_map(|y| (0..width).map(move |x| (x, y))).map(|(x, y)| canvas.pixel(x, y)).collect();
    assert_eq!(pixels, drawn, "the PNG holds the canvas");
    // The line runs the plot's width (plus its legend swatch); the mark is one 7 x 7 square
    // (plus the swatch).
    assert!(count(&canvas, red) > 2 * 600, "{}", count(&canvas, red));
    assert_eq!(count(&canvas, blue), 49 + 18 * 6);
    // The line falls from left to right: its left end is higher (a smaller row).
    let rows_of = |x: usize| (0..height).filter(|&y| canvas.pixel(x, y) == red).collect::<Vec<_>>();
    assert!(rows_of(120)[0] < rows_of(800)[0]);

    // Nothing to draw is an empty chart, not a panic.
    let empty = LineChart { series: vec![], ..chart };
    assert_eq!(decode(&empty.draw().png()).0, 960);
}

#[test]
fn a_runs_metrics_become_its_charts() {
    let dir = common::scratch("plot-metrics");
    let nsa_run = dir.join("nsa");
    std::fs::create_dir_all(&nsa_run).unwrap();
    let mut lines: Vec<String> = (1..=4)
        .map(|s| {
            format!(
                "{{\"step\":{s},\"loss\":{},\"tokens_per_s\":{},\"gate_cmp\":0.2,\"gate_slc\":0.3,\"gate_win\":0.5}}",
                6.0 - s as f64,
                1000 * s
            )
        })
        .collect();
    lines.insert(2, "{\"step\":2,\"valid_loss\":4.5,\"valid_perplexity\":90.0}".into());
    lines.push("{\"step\":5,\"loss\":1.".into()); // a write cut short
    std::fs::write(nsa_run.join("metrics.jsonl"), lines.join("\n")).unwrap();
    let dense = dir.join("dense");
    std::fs::create_dir_all(&dense).unwrap();
    std::fs::write(dense.join("metrics.jsonl"), "{\"step\":1,\"loss\":5.0,\"tokens_per_s\":900.0}\n").unwrap();

    let run = RunMetrics::read(&nsa_run).unwrap();
    assert_eq!(run.name, "nsa");
    assert_eq!(run.loss, vec![(1.0, 5.0), (2.0, 4.0), (3.0, 3.0), (4.0, 2.0)]);
    assert_eq!(run.valid_loss, vec![(2.0, 4.5)]);
    assert_eq!(run.tokens_per_s[3], (4.0, 4000.0));
    assert_eq!(run.gates.len(), 4);

    let both = [run.clone(), RunMetrics::read(&dense).unwrap()];
    let names: Vec<&str> = charts(&both).iter().map(|(file, _)| *file).collect();
    assert_eq!(names, ["loss.png", "tokens_per_s.png", "gates.png"]);
    let loss = &charts(&both)[0].1;
    let labels: Vec<&str> = loss.series.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(labels, ["nsa train", "nsa valid", "dense train"]);
    assert_eq!(charts(&both)[2].1.series.len(), 3, "the dense run has no gates");
    assert_eq!(charts(&both[1..]).len(), 2, "no gate chart without gates");

    let missing = RunMetrics::read(&dir.join("nowhere")).unwrap_err();
    assert!(missing.contains("cannot read") && !missing.contains('\n'), "{missing}");
}

#[test]
fn the_needle_heat_map_colours_each_cell_by_its_accuracy() {
    let cell = |length, depth, correct| NeedleCell {
        length,
        depth,
        correct,
        trials: 4,
        keys: Vec::new(),
        answers: Vec::new(),
        digits: 0,
    };
    let cells = [cell(1024, 0, 4), cell(1024, 50, 2), cell(4096, 0, 0), cell(4096, 50, 1)];
    let map = heat_map(&cells, &[1024, 4096], &[0, 50]);
    assert_eq!(map.values, vec![vec![Some(1.0), Some(0.5)], vec![Some(0.0), Some(0.25)]]);
    let canvas = map.draw();
    for share in [1.0, 0.5, 0.0, 0.25] {
        // A cell's background, less its label's pixels.
        assert!(count(&canvas, share_color(share)) > 2000, "share {share}");
    }
    assert_ne!(share_color(0.0), share_color(1.0));
    let (width, height, _) = decode(&canvas.png());
    assert_eq!((width, height), (canvas.width, canvas.height));
}

//! The decode step's hand-over kernel (`nsa_kernels::decode_write`: a layer's projection of the
//! new tokens -> rotated queries, the gates' sigmoid, and each branch's key and value written
//! into its cache) on WGPU (Mesa lavapipe in CI, f32) against float64 loops on fresh random
//! inputs: queries and gates to 1e-5, and every cache equal to the one the loops write, so a
//! write into a wrong slot, row or head, or a slot written that should not be, fails.
//!
//! Rows at different positions, rings that have wrapped and one that has not, three key/value
//! sets (one per branch) and one shared set.

use burn::tensor::{Int, Tensor, TensorData};
use nsa_kernels::{decode_write, StepLayout};
use nsa_tests::{fresh_rng, max_rel_err, normal, to_vec};
use rand::rngs::StdRng;

type Wgpu = burn::backend::Wgpu;

const POSITIONS: [usize; 3] = [0, 13, 37];
/// Slots of the tail ring, the selected store and the window ring.
const SLOTS: [usize; 3] = [8, 40, 16];

fn tensor<const D: usize>(data: &[f64], shape: [usize; D]) -> Tensor<Wgpu, D> {
    Tensor::from_data(TensorData::new(data.iter().map(|&x| x as f32).collect(), shape), &Default::default())
}

/// The rotation's cosines and sines at `t`, `[d]` each, each pair's angle twice.
fn rotation(t: usize, d: usize) -> [Vec<f64>; 2] {
    let angle = |i: usize| t as f64 * 10000f64.powf(-2.0 * (i / 2) as f64 / d as f64);
    [(0..d).map(|i| angle(i).cos()).collect(), (0..d).map(|i| angle(i).sin()).collect()]
}

/// Columns `at..at + d` of `row`, rotated at position `t` (interleaved pairs).
fn rotated(row: &[f64], at: usize, d: usize, t: usize) -> Vec<f64> {
    let [cos, sin] = rotation(t, d);
    (0..d)
        .map(|i| {
            let (x, pair) = (row[at + i], row[at + (i ^ 1)]);
            let swapped = if i % 2 == 0 { -pair } else { pair };
            x * cos[i] + swapped * sin[i]
        })
        .collect()
}

fn check(rng: &mut StdRng, layout: StepLayout) {
    let StepLayout { heads, kv_heads, d_k, d_v, kv_sets } = layout;
    let b = POSITIONS.len();
    let keys_at = heads * d_k;
    let values_at = keys_at + kv_sets * kv_heads * d_k;
    let gates_at = values_at + kv_sets * kv_heads * d_v;
    let width = gates_at + 3 * heads;
    let projected = normal(rng, b * width, 1.0);
    let bias = normal(rng, 3 * heads, 1.0);
    let caches: Vec<[Vec<f64>; 2]> = SLOTS
        .iter()
        .map(|&s| [normal(rng, b * kv_heads * s * d_k, 1.0), normal(rng, b * kv_heads * s * d_v, 1.0)])
        .collect();

    // The loops: what the kernel must leave.
    let (mut queries, mut gates, mut expected) = (Vec::new(), Vec::new(), caches.clone());
    for (row, &t) in POSITIONS.iter().enumerate() {
        let y = &projected[row * width..][..width];
        for h in 0..heads {
            queries.extend(rotated(y, h * d_k, d_k, t));
        }
        gates.extend((0..3 * heads).map(|i| 1.0 / (1.0 + (-(y[gates_at + i] + bias[i])).exp())));
        for (branch, &slots) in SLOTS.iter().enumerate() {
            let set = if kv_sets == 1 { 0 } else { branch };
            for hk in 0..kv_heads {
                let key = rotated(y, keys_at + (set * kv_heads + hk) * d_k, d_k, t);
                let value = &y[values_at + (set * kv_heads + hk) * d_v..][..d_v];
                let slot = (row * kv_heads + hk) * slots + t % slots;
                expected[branch][0][slot * d_k..][..d_k].copy_from_slice(&key);
                expected[branch][1][slot * d_v..][..d_v].copy_from_slice(value);
            }
        }
    }

    let [cos, sin] = [0, 1].map(|k| POSITIONS.iter().flat_map(|&t| rotation(t, d_k)[k].clone()).collect::<Vec<_>>());
    let positions = Tensor::<Wgpu, 1, Int>::from_data(
        TensorData::new(POSITIONS.iter().map(|&t| t as i64).collect::<Vec<_>>(), [b]),
        &Default::default(),
    );
    let inputs: Vec<[Tensor<Wgpu, 4>; 2]> = caches
        .iter()
        .zip(SLOTS)
        .map(|([k, v], s)| [tensor(k, [b, kv_heads, s, d_k]), tensor(v, [b, kv_heads, s, d_v])])
        .collect();
    let inputs: [[Tensor<Wgpu, 4>; 2]; 3] = inputs.try_into().unwrap();
    let written = decode_write(
        tensor(&projected, [b, width]),
        tensor(&bias, [3 * heads]),
        [tensor(&cos, [b, d_k]), tensor(&sin, [b, d_k])],
        positions,
        inputs,
        layout,
    );
    let name = format!("{layout:?}");
    let err = max_rel_err(&to_vec(written.queries), &queries);
    assert!(err <= 1e-5, "{name}: queries differ by {err:e}");
    let err = max_rel_err(&to_vec(written.gates), &gates);
    assert!(err <= 1e-5, "{name}: gates differ by {err:e}");
    for (branch, (pair, want)) in written.caches.into_iter().zip(&expected).enumerate() {
        for (which, (got, want)) in pair.into_iter().zip(want).enumerate() {
            let err = max_rel_err(&to_vec(got), want);
            assert!(err <= 1e-5, "{name}: cache {branch} ({}) differs by {err:e}", ["keys", "values"][which]);
        }
    }
}

#[test]
fn wgpu_decode_write_matches_float64_loops() {
    let mut rng = fresh_rng("wgpu_decode_write_matches_float64_loops");
    check(&mut rng, StepLayout { heads: 6, kv_heads: 2, d_k: 8, d_v: 12, kv_sets: 3 });
    check(&mut rng, StepLayout { heads: 4, kv_heads: 1, d_k: 16, d_v: 16, kv_sets: 1 });
}

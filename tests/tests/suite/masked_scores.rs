//! The tensor-core dQ's score step without its MMA, so WGPU runs it: one lane's two rows of a
//! key tile masked and scaled (`mask_and_scale`), then turned into `ds = p (dp - delta)`
//! (`score_gradients`), held to the host at the head dims whose scale is above and below 0.1.
//! One row has no key at all (the compressed branch before its document's first block, whose
//! log-sum-exp is `NEG_LARGE`): its `ds` must be zero, not `inf`.

use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use cubecl::prelude::*;
use nsa_kernels::kernel::primitives::fragments::{Pair, MMA_N};
use nsa_kernels::kernel::primitives::query_cube::LaneRows;
use nsa_kernels::kernel::primitives::rows::NEG_LARGE;
use nsa_kernels::kernel::primitives::softmax::mask_and_scale;
use nsa_kernels::kernel::window::dq::score_gradients;
use nsa_tests::{fresh_rng, normal};

const KEY_TILE: usize = 32;
/// Lane 0 holds keys `8j` and `8j + 1` of the tile, for rows `t[0]` and `t[1]`.
const LANE_KEYS: usize = 2 * KEY_TILE / MMA_N;

/// `rows` holds each row's `[t, start, lse, delta]`; `raw` and `dp` the lane's pairs in
/// register order (element `2 (2j + half) + e`), and `ds` gets the result in the same order.
#[cube(launch)]
fn lane_score_gradients(
    raw: &Array<f32>,
    dp: &Array<f32>,
    rows: &Array<f32>,
    ds: &mut Array<f32>,
    scale: f32,
    #[comptime] key_tile: usize,
) {
    let pairs = comptime!(2 * key_tile / MMA_N);
    let mut scores = Array::<Pair<f32>>::new(pairs);
    let mut dps = Array::<Pair<f32>>::new(pairs);
    #[unroll]
    for i in 0..pairs {
        let mut s = Pair::<f32>::empty();
        let mut d = Pair::<f32>::empty();
        #[unroll]
        for e in 0..2usize {
            s[e] = raw[2 * i + e];
            d[e] = dp[2 * i + e];
        }
        scores[i] = s;
        dps[i] = d;
    }
    let mut lanes = LaneRows {
        t: Array::<usize>::new(2usize),
        h: Array::<usize>::new(2usize),
        active: Array::<bool>::new(2usize),
        start: Array::<usize>::new(2usize),
    };
    let mut lse = Array::<f32>::new(2usize);
    let mut delta = Array::<f32>::new(2usize);
    #[unroll]
    for half in 0..2usize {
        lanes.t[half] = rows[4 * half] as usize;
        lanes.start[half] = rows[4 * half + 1] as usize;
        lanes.h[half] = 0usize;
        lanes.active[half] = true;
        lse[half] = rows[4 * half + 2];
        delta[half] = rows[4 * half + 3];
    }
    mask_and_scale(&mut scores, &lanes, 0usize, key_tile, 1024usize, scale, 0usize, true, key_tile);
    score_gradients(&mut scores, &dps, &lse, &delta, scale, key_tile);
    #[unroll]
    for i in 0..pairs {
        #[unroll]
        for e in 0..2usize {
            ds[2 * i + e] = scores[i][e];
        }
    }
}

#[test]
fn masked_scores_give_no_gradient_at_any_head_dim() {
    let client = WgpuRuntime::client(&WgpuDevice::default());
    let mut rng = fresh_rng("masked_scores");
    // Row 0 has no key (its document starts at 24, after it); row 1 sees keys 0..=9 of which
    // the lane holds 0, 1, 8 and 9.
    let rows = [(5usize, 24usize), (9, 0)];
    let key_of = |i: usize, e: usize| MMA_N * (i / 2) + e;
    for d_k in [64usize, 128, 192] {
        let scale = 1.0 / (d_k as f64).sqrt();
        let raw = normal(&mut rng, 2 * LANE_KEYS, 4.0);
        let dp = normal(&mut rng, 2 * LANE_KEYS, 1.0);
        let delta = normal(&mut rng, 2, 1.0);
        let seen = |half: usize, key: usize| key <= rows[half].0 && key >= rows[half].1;
        // Row 1's log-sum-exp over its keys (a lane holds only some of them: any finite
        // value above its scores' maximum does here).
        let mut lse1 = f64::MIN;
        for i in (1..LANE_KEYS).step_by(2) {
            for e in (0..2).filter(|&e| seen(1, key_of(i, e))) {
                lse1 = lse1.max(raw[2 * i + e] * scale + 1.0);
            }
        }
        let stats = [rows[0].0 as f64, rows[0].1 as f64, NEG_LARGE as f64, delta[0]];
        let stats = [stats, [rows[1].0 as f64, rows[1].1 as f64, lse1, delta[1]]].concat();
        let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let (raw32, dp32, stats32) = (f32s(&raw), f32s(&dp), f32s(&stats));
        let raw_dev = client.create_from_slice(f32::as_bytes(&raw32));
        let dp_dev = client.create_from_slice(f32::as_bytes(&dp32));
        let stats_dev = client.create_from_slice(f32::as_bytes(&stats32));
        let ds_dev = client.empty(2 * LANE_KEYS * 4);
        lane_score_gradients::launch::<WgpuRuntime>(
            &client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            unsafe { ArrayArg::from_raw_parts(raw_dev, 2 * LANE_KEYS) },
            unsafe { ArrayArg::from_raw_parts(dp_dev, 2 * LANE_KEYS) },
            unsafe { ArrayArg::from_raw_parts(stats_dev, 8) },
            unsafe { ArrayArg::from_raw_parts(ds_dev.clone(), 2 * LANE_KEYS) },
            scale as f32,
            KEY_TILE,
        );
        let ds = f32::from_bytes(&client.read_one(ds_dev).expect("read ds")).to_vec();
        for i in 0..LANE_KEYS {
            let half = i % 2;
            for e in 0..2 {
                let key = key_of(i, e);
                let want = match seen(half, key) {
                    true => (raw[2 * i + e] * scale - lse1).exp() * (dp[2 * i + e] - delta[1]),
                    false => 0.0,
                };
                let got = ds[2 * i + e] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "d_k {d_k}: row {half} key {key}: ds {got}, want {want}"
                );
            }
        }
    }
}

//! Kernels and primitives of the tensor-core plans that WGPU can run (no MMA in them), held to
//! host computations: `row_delta`, the selection's merge of partial results, the quad transpose
//! behind whole-row stores, and the inverted block index.

use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::tensor::{DType, Int, Tensor};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::CubeDim;

type B = CubeBackend<WgpuRuntime, f32, i32, u32>;

/// `row_delta` (the tensor-core backward's `delta = dO . O`) has no MMA, so WGPU runs it: checked
/// against Burn's own product and sum on fresh random rows (the last cube partly past the end),
/// with and without zeroing the dQ sum on the way (`d_k = 44`, not a multiple of the 8 units of
/// a row, so the last columns' bound is exercised; a random buffer, so a missed element shows).
#[test]
fn row_delta_matches_a_product_and_sum() {
    use burn::tensor::Distribution;
    let device = WgpuDevice::default();
    let shape = [2, 77, 3, 64];
    let out = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let grad_out = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let want = (out.clone() * grad_out.clone()).sum_dim(3).squeeze_dim::<3>(3);
    let d_k = 44;
    for zero_d_k in [0, d_k] {
        let delta = Tensor::<B, 3>::zeros([2, 77, 3], &device);
        let sum = Tensor::<B, 4>::random([2, 77, 3, d_k], Distribution::Uniform(1.0, 2.0), &device);
        let (o, g, d, s) = (
            out.clone().into_primitive().tensor(),
            grad_out.clone().into_primitive().tensor(),
            delta.into_primitive().tensor(),
            sum.clone().into_primitive().tensor(),
        );
        let client = o.client.clone();
        nsa_kernels::kernel::row_delta::row_delta::launch::<WgpuRuntime>(
            &client,
            // 462 rows, 16 per cube.
            CubeCount::Static(29, 1, 1),
            CubeDim::new_2d(8, 16),
            nsa_kernels::kernel::primitives::layout::VECTOR,
            o.into_tensor_arg(),
            g.into_tensor_arg(),
            d.clone().into_tensor_arg(),
            s.clone().into_tensor_arg(),
            64,
            16,
            zero_d_k,
            DType::F32.into(),
        );
        let got = Tensor::<B, 3>::from_primitive(burn::tensor::TensorPrimitive::Float(d));
        let err = (got - want.clone()).abs().max().into_scalar();
        let scale = want.clone().abs().max().into_scalar();
        assert!(err <= 1e-5 * scale.max(1.0), "row_delta off by {err} (values up to {scale})");
        let after = Tensor::<B, 4>::from_primitive(burn::tensor::TensorPrimitive::Float(s));
        if zero_d_k == 0 {
            let moved = (after - sum).abs().max().into_scalar();
            assert!(moved == 0.0, "row_delta without zeroing changed the dQ sum by {moved}");
        } else {
            let left = after.abs().max().into_scalar();
            assert!(left == 0.0, "row_delta left {left} in the dQ sum it zeroes");
        }
    }
}

/// `merge_selection_partials` (the key-major selection forward's second pass) has no MMA, so
/// WGPU runs it: fresh random per-block outputs and log-sum-exps, with unused slots (negative
/// blocks, their partials garbage) and blocks wholly after the query (`NEG_LARGE`), merged and
/// checked against a float64 log-sum-exp on the host.
#[test]
fn merge_selection_partials_matches_a_float64_log_sum_exp() {
    use burn::tensor::TensorData;
    use nsa_tests::{fresh_rng, normal};
    use rand::Rng;
    const NEG_LARGE: f64 = -1.0e30;
    let device = WgpuDevice::default();
    let mut rng = fresh_rng("merge_selection_partials");
    let (b, t, h_q, h_kv, n, d_v) = (2, 7, 6, 2, 5, 16);
    let rows = b * t * h_q;
    let part_out = normal(&mut rng, rows * n * d_v, 1.0);
    let mut part_lse = normal(&mut rng, rows * n, 3.0);
    let blocks: Vec<i32> =
        (0..b * t * h_kv * n).map(|_| if rng.random_bool(0.3) { -1 } else { rng.random_range(0..9) }).collect();
    // Some listed blocks lie wholly after their query; one row of each batch has only those.
    for (i, lse) in part_lse.iter_mut().enumerate() {
        if rng.random_bool(0.2) || (i / n) % (t * h_q) == 3 {
            *lse = NEG_LARGE;
        }
    }
    let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<_>>();
    let (o, l) = (
        Tensor::<B, 4>::from_data(TensorData::new(f32s(&part_out), [b, t, h_q, n * d_v]), &device),
        Tensor::<B, 4>::from_data(TensorData::new(f32s(&part_lse), [b, t, h_q, n]), &device),
    );
    let blocks_t = Tensor::<B, 4, Int>::from_data(TensorData::new(blocks.clone(), [b, t, h_kv, n]), &device);
    let (out, lse) = (Tensor::<B, 4>::zeros([b, t, h_q, d_v], &device), Tensor::<B, 3>::zeros([b, t, h_q], &device));
    let (out_p, lse_p) = (out.into_primitive().tensor(), lse.into_primitive().tensor());
    let client = out_p.client.clone();
    let vector = nsa_kernels::kernel::primitives::layout::VECTOR;
    let units = rows * d_v / vector;
    nsa_kernels::kernel::selection::merge::merge_selection_partials::launch::<WgpuRuntime>(
        &client,
        CubeCount::Static(units.div_ceil(32) as u32, 1, 1),
        CubeDim::new_1d(32),
        vector,
        o.into_primitive().tensor().into_tensor_arg(),
        l.into_primitive().tensor().into_tensor_arg(),
        blocks_t.into_primitive().into_tensor_arg(),
        out_p.clone().into_tensor_arg(),
        lse_p.clone().into_tensor_arg(),
        d_v,
        vector,
        [DType::F32.into(), DType::I32.into()],
    );
    let got_out = Tensor::<B, 4>::from_primitive(burn::tensor::TensorPrimitive::Float(out_p))
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let got_lse = Tensor::<B, 3>::from_primitive(burn::tensor::TensorPrimitive::Float(lse_p))
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    for row in 0..rows {
        let (bt, h) = (row / h_q, row % h_q);
        let hk = h / (h_q / h_kv);
        let used: Vec<usize> = (0..n)
            .filter(|&i| blocks[(bt * h_kv + hk) * n + i] >= 0 && part_lse[row * n + i] > NEG_LARGE / 2.0)
            .collect();
        let (want_lse, weights) = if used.is_empty() {
            (NEG_LARGE, vec![])
        } else {
            let m = used.iter().map(|&i| part_lse[row * n + i]).fold(f64::MIN, f64::max);
            let lse = m + used.iter().map(|&i| (part_lse[row * n + i] - m).exp()).sum::<f64>().ln();
            (lse, used.iter().map(|&i| (i, (part_lse[row * n + i] - lse).exp())).collect())
        };
        let lse_err = (got_lse[row] as f64 - want_lse).abs() / want_lse.abs().max(1.0);
        assert!(lse_err < 1e-5, "row {row}: lse {} vs {want_lse}", got_lse[row]);
        for c in 0..d_v {
            let want: f64 = weights.iter().map(|&(i, w)| w * part_out[(row * n + i) * d_v + c]).sum();
            let got = got_out[row * d_v + c] as f64;
            assert!((got - want).abs() < 1e-5 * want.abs().max(1.0), "row {row} col {c}: {got} vs {want}");
        }
    }
}

/// A test kernel of its own module: Burn's `Tensor` is imported above.
mod tile_kernel {
    use cubecl::prelude::*;

    /// Reads a `[16, d]` tile into the registers of one plane in the MMA result layout (lane `l`
    /// holds rows `l / 4` and `l / 4 + 8`, columns `8j + 2 (l % 4)` and `+ 1` of each 8-column
    /// tile) and writes it back through `store_rows_whole`.
    #[cube(launch)]
    pub fn store_tile_whole<N: Size>(src: &Tensor<f32>, dst: &mut Tensor<Vector<f32, N>>, #[comptime] d: usize) {
        use nsa_kernels::kernel::primitives::fragments::{store_rows_whole, Pair};
        let lane = UNIT_POS_X as usize;
        let mut tiles = Array::<Pair<f32>>::new(comptime!(2 * d / 8));
        let mut row_at = Array::<usize>::new(2usize);
        let mut write = Array::<bool>::new(2usize);
        #[unroll]
        for half in 0..2usize {
            let row = lane / 4 + 8 * half;
            #[unroll]
            for j in 0..d / 8 {
                let at = row * d + 8 * j + 2 * (lane % 4);
                let mut pair = Pair::<f32>::new(0.0f32);
                pair[0] = src[at];
                pair[1] = src[at + 1];
                tiles[2 * j + half] = pair;
            }
            row_at[half] = row * comptime!(d / 8);
            write[half] = true;
        }
        store_rows_whole::<f32, N>(dst, &row_at, &write, &tiles, lane, d);
    }
}

/// `store_rows_whole` (the selection forward's partial results as whole 16-byte rows: a quad's
/// 4x4 transpose by shuffles) puts every element where it belongs, for a head dim whose tiles
/// fill whole groups of four (64) and one whose last group is half empty (48).
#[test]
fn store_rows_whole_writes_each_row_where_it_belongs() {
    use burn::tensor::Distribution;
    let device = WgpuDevice::default();
    for d in [64usize, 48] {
        let src = Tensor::<B, 2>::random([16, d], Distribution::Normal(0.0, 1.0), &device);
        let dst = Tensor::<B, 2>::zeros([16, d], &device);
        let (s, t) = (src.clone().into_primitive().tensor(), dst.into_primitive().tensor());
        let client = s.client.clone();
        tile_kernel::store_tile_whole::launch::<WgpuRuntime>(
            &client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_2d(32, 1),
            nsa_kernels::kernel::primitives::layout::VECTOR,
            s.into_tensor_arg(),
            t.clone().into_tensor_arg(),
            d,
        );
        let got = Tensor::<B, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(t));
        let err = (got - src).abs().max().into_scalar();
        assert!(err == 0.0, "d = {d}: rows stored off by {err}");
    }
}

/// The inverted block index on WGPU against a CPU inversion of random block lists: each
/// `(b, hk, block)` lists every query that selected it once, with the block's slot in that
/// query's list. Tallies of 8 bins and cubes of 4 queries, so that both the shared tallies
/// (the first blocks) and the global atomics (the rest) are taken, by several cubes per list.
#[test]
fn inverted_index_lists_every_selecting_query_once() {
    use burn::tensor::TensorData;
    use nsa_kernels::kernel::selection::index as inverse;
    use nsa_tests::fresh_rng;
    let device = WgpuDevice::default();
    let mut rng = fresh_rng("inverted_index_lists_every_selecting_query_once");
    let (b, t, h_kv, n, n_blocks, rows, hot_bins) = (2, 37, 2, 5, 12, 4, 8);
    let blocks = random_lists(&mut rng, b * t * h_kv, n, n_blocks);
    // Zeros relabelled u32 (Burn's int here is i32, of the same width).
    let u32s = |shape: [usize; 3]| CubeTensor {
        dtype: DType::U32,
        ..Tensor::<B, 3, Int>::zeros(shape, &device).into_primitive()
    };
    let blocks_t = Tensor::<B, 4, Int>::from_data(TensorData::new(blocks.clone(), [b, t, h_kv, n]), &device);
    let [counts, offsets, cursor, base] = [0; 4].map(|_| u32s([b, h_kv, n_blocks]));
    let [entries, slots] = [0; 2].map(|_| u32s([b, h_kv, t * n]));
    let segment_block = u32s([b, h_kv, t * n + n_blocks]);
    let segment_total = u32s([b, h_kv, 1]);
    let client = counts.client.clone();
    let cubes = CubeCount::Static(t.div_ceil(rows) as u32, b as u32, 1);
    let blocks_p = blocks_t.into_primitive();
    let int = DType::I32;
    inverse::count_selections::launch::<WgpuRuntime>(
        &client,
        cubes.clone(),
        CubeDim::new_1d(32),
        blocks_p.clone().into_tensor_arg(),
        counts.clone().into_tensor_arg(),
        n_blocks as u32,
        rows,
        hot_bins,
        int.into(),
    );
    inverse::scan_counts::launch::<WgpuRuntime>(
        &client,
        CubeCount::Static((b * h_kv) as u32, 1, 1),
        CubeDim::new_1d(32),
        counts.clone().into_tensor_arg(),
        offsets.clone().into_tensor_arg(),
        base.into_tensor_arg(),
        segment_block.into_tensor_arg(),
        segment_total.into_tensor_arg(),
        8,
        32,
    );
    inverse::fill_selections::launch::<WgpuRuntime>(
        &client,
        cubes,
        CubeDim::new_1d(32),
        blocks_p.into_tensor_arg(),
        offsets.clone().into_tensor_arg(),
        cursor.into_tensor_arg(),
        entries.clone().into_tensor_arg(),
        slots.clone().into_tensor_arg(),
        rows,
        hot_bins,
        int.into(),
    );
    let read = |x: CubeTensor<WgpuRuntime>| -> Vec<u32> {
        let bytes = client.read_one(x.handle.clone()).expect("read back");
        bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    let index = [read(counts), read(offsets), read(entries), read(slots)];
    assert_index_lists(&index, &blocks, [b, t, h_kv, n, n_blocks]);
}

/// `rows` lists of `n` slots: distinct blocks below `n_blocks`, block 0 in every list, one
/// unused slot (-1), in random order.
fn random_lists(rng: &mut rand::rngs::StdRng, rows: usize, n: usize, n_blocks: usize) -> Vec<i32> {
    use rand::seq::SliceRandom;
    let mut blocks = Vec::new();
    for _ in 0..rows {
        let mut row: Vec<i32> = (1..n_blocks as i32).collect();
        row.shuffle(rng);
        row.truncate(n - 2);
        row.extend([0, -1]);
        row.shuffle(rng);
        blocks.extend(row);
    }
    blocks
}

/// Each block's list in the inverted index (`[counts, offsets, entries, slots]`) holds exactly
/// the (query, slot) pairs whose list names the block.
fn assert_index_lists(index: &[Vec<u32>; 4], blocks: &[i32], [b, t, h_kv, n, n_blocks]: [usize; 5]) {
    let [counts, offsets, entries, slots] = index;
    for bb in 0..b {
        for hk in 0..h_kv {
            for j in 0..n_blocks {
                let list = (bb * h_kv + hk) * n_blocks + j;
                let mut want: Vec<(u32, u32)> = (0..t)
                    .flat_map(|tt| (0..n).map(move |i| (tt, i)))
                    .filter(|&(tt, i)| blocks[((bb * t + tt) * h_kv + hk) * n + i] == j as i32)
                    .map(|(tt, i)| (tt as u32, i as u32))
                    .collect();
                assert_eq!(counts[list] as usize, want.len(), "count of list {list}");
                let at = (bb * h_kv + hk) * t * n + offsets[list] as usize;
                let mut got: Vec<(u32, u32)> = (at..at + want.len()).map(|e| (entries[e], slots[e])).collect();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "queries of list {list} (block {j})");
            }
        }
    }
}

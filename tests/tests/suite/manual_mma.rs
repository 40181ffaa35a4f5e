//! CubeCL's manual MMA on a CUDA device (`MmaDefinition`, m16n8k16, bf16 in, f32 accumulation):
//! the per-lane register layout `position_of_nth` reports, checked by a product against the
//! host on fresh random inputs. Kernels that keep scores, probabilities and the output in
//! registers (flash attention 2's layout, docs/kernels.md) rest on it. Needs a GPU:
//! `cargo test -p nsa-tests --features cuda manual_mma` (CI, without the feature, compiles
//! nothing here).

use burn::tensor::bf16;
use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::prelude::*;
use rand::{Rng, SeedableRng};

const M: usize = 16;
const N: usize = 8;
const K: usize = 16;

/// `c = a b` for row-major `a [16, 16]`, `b [16, 8]`, `c [16, 8]`, by one plane: each lane
/// gathers its registers where `position_of_nth` says and scatters the product the same way.
#[cube(launch)]
fn manual_product<NA: Size, NC: Size>(a: &Array<f32>, b: &Array<f32>, c: &mut Array<f32>) {
    let def = MmaDefinition::<bf16, bf16, f32>::new(M, N, K);
    let lane = UNIT_POS_X;
    let (va, vb, vc) = (
        def.vectors_per_lane(MatrixIdent::A),
        def.vectors_per_lane(MatrixIdent::B),
        def.vectors_per_lane(MatrixIdent::Accumulator),
    );
    let ra = gather::<NA>(def, a, MatrixIdent::A, va, K);
    // (row, col) of B is (k, n).
    let rb = gather::<NA>(def, b, MatrixIdent::B, vb, N);
    let mut rc = Array::<Vector<f32, NC>>::new(vc);
    #[unroll]
    for i in 0..vc {
        rc[i] = Vector::<f32, NC>::new(0.0f32);
    }
    let rd = def.execute(&ra, &rb, &rc);
    #[unroll]
    for i in 0..vc {
        #[unroll]
        for e in 0..NC::value() {
            let (row, col) = def.position_of_nth(lane, (i * NC::value() + e) as u32, MatrixIdent::Accumulator);
            c[row as usize * N + col as usize] = rd[i][e];
        }
    }
}

/// This lane's `vectors` registers of operand `ident`, gathered from row-major `src` (`cols`
/// columns) where `position_of_nth` places them.
#[cube]
fn gather<NA: Size>(
    def: MmaDefinition<bf16, bf16, f32>,
    src: &Array<f32>,
    #[comptime] ident: MatrixIdent,
    #[comptime] vectors: usize,
    #[comptime] cols: usize,
) -> Array<Vector<bf16, NA>> {
    let mut regs = Array::<Vector<bf16, NA>>::new(vectors);
    #[unroll]
    for i in 0..vectors {
        let mut v = Vector::<bf16, NA>::empty();
        #[unroll]
        for e in 0..NA::value() {
            let (row, col) = def.position_of_nth(UNIT_POS_X, (i * NA::value() + e) as u32, ident);
            v[e] = bf16::cast_from(src[row as usize * cols + col as usize]);
        }
        regs[i] = v;
    }
    regs
}

#[test]
fn manual_mma_layout_matches_a_host_product() {
    let client = CudaRuntime::client(&CudaDevice::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Values exact in bf16 (small integers / 8), so the product is exact in f32.
    let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-16i32..=16) as f32 / 8.0).collect::<Vec<f32>>();
    let (a, b) = (draw(M * K), draw(K * N));
    let a_dev = client.create_from_slice(f32::as_bytes(&a));
    let b_dev = client.create_from_slice(f32::as_bytes(&b));
    let c_dev = client.empty(M * N * 4);
    manual_product::launch::<CudaRuntime>(
        &client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(32),
        2,
        2,
        unsafe { ArrayArg::from_raw_parts(a_dev, M * K) },
        unsafe { ArrayArg::from_raw_parts(b_dev, K * N) },
        unsafe { ArrayArg::from_raw_parts(c_dev.clone(), M * N) },
    );
    let c = f32::from_bytes(&client.read_one(c_dev).expect("read the product")).to_vec();
    for i in 0..M {
        for j in 0..N {
            let want: f32 = (0..K).map(|k| a[i * K + k] * b[k * N + j]).sum();
            assert_eq!(c[i * N + j], want, "c[{i}][{j}]");
        }
    }
}

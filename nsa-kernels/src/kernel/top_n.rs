//! The top-n block selection, one unit per query row `(b, hk, t)`.
//!
//! Block `j` is eligible for query `t` when `j * block_size <= t`. Block 0 and the local blocks
//! `t / block_size` and `t / block_size - 1` are always taken and count towards `n`; the rest go
//! to the eligible blocks with the highest score, ties to the lower index: a candidate is taken
//! when fewer candidates beat it than slots remain (the rank the tensor-op path computes).

use cubecl::prelude::*;

/// `scores [B, H_kv, T, nb]` (f32, contiguous) -> `list [B, T, H_kv, n]` (ascending block
/// indices, `-1` in unused slots) and `taken [B, H_kv, T, nb]` (1 where selected, else 0).
#[cube(launch)]
pub fn select_top_n<I: Int>(
    scores: &Tensor<f32>,
    list: &mut Tensor<I>,
    taken: &mut Tensor<I>,
    block_size: u32,
    n: u32,
    #[define(I)] _int: StorageType,
) {
    let (h_kv, t_len, nb) = (scores.shape(1), scores.shape(2), scores.shape(3));
    let pos = ABSOLUTE_POS;
    if pos >= scores.shape(0) * h_kv * t_len {
        terminate!();
    }
    let n = n as usize;
    let t = pos % t_len;
    let hk = (pos / t_len) % h_kv;
    let b = pos / (t_len * h_kv);
    let row = pos * nb;
    let current = t / block_size as usize;
    // Distinct forced blocks: {0} for t < l', {0, 1} in block 1, three from block 2 on.
    let forced_count = min(current, 2usize) + 1;
    let mut remaining = 0usize;
    if n > forced_count {
        remaining = n - forced_count;
    }
    let last = min(current + 1, nb);
    let list_row = ((b * t_len + t) * h_kv + hk) * n;
    let mut slot = 0usize;
    for j in 0..nb {
        let mut selected = false;
        if j < last {
            if j == 0 || j == current || j + 1 == current {
                selected = true;
            } else {
                let own = scores[row + j];
                let mut beaten = 0usize;
                for i in 1..last {
                    let candidate = i != current && i + 1 != current;
                    let rival = scores[row + i];
                    if candidate && (rival > own || (rival == own && i < j)) {
                        beaten += 1;
                    }
                }
                selected = beaten < remaining;
            }
        }
        let mut flag = I::new(0);
        if selected {
            flag = I::new(1);
            if slot < n {
                list[list_row + slot] = I::cast_from(j as u32);
            }
            slot += 1;
        }
        taken[row + j] = flag;
    }
    while slot < n {
        list[list_row + slot] = I::new(-1);
        slot += 1;
    }
}

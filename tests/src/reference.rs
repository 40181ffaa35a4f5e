//! A slow, obviously-correct float64 loop version of `shared/docs/nsa-spec.md`.
//!
//! Written from the spec alone, one query at a time: no masks, no batching, no shared code with
//! `nsa-core` beyond the config struct. Every fast path is held to this.

use nsa_core::NsaConfig;

/// Row-major `[rows, cols]` matrix; linear layers compute `y = x W (+ b)` as Burn's do.
#[derive(Clone, Debug)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl Mat {
    pub fn at(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.cols + c]
    }

    /// `x W` for one input row.
    pub fn apply(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.rows);
        (0..self.cols).map(|c| (0..self.rows).map(|r| x[r] * self.at(r, c)).sum()).collect()
    }
}

/// A learned `phi`'s parameters.
#[derive(Clone, Debug)]
pub enum PhiWeights {
    /// `phi = linear`: position embedding `[l, h]` (none: zero) and map `[l*h, h]`.
    Linear { position: Option<Mat>, weight: Mat },
    /// `phi = mlp`: position embedding `[l, h]`, then `[l*h, hidden]` and `[hidden, h]` with
    /// their biases, GELU between.
    Mlp { position: Mat, hidden: Mat, hidden_bias: Vec<f64>, output: Mat, output_bias: Vec<f64> },
}

/// GELU: `x Phi(x)`, `Phi` the standard normal's distribution function (std has no `erf`).
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// Every weight of one NSA layer.
#[derive(Clone, Debug)]
pub struct NsaWeights {
    pub query: Mat,
    /// `(W_k, W_v)` per branch `[cmp, slc, win]`, or one pair when `shared_kv`.
    pub kv: Vec<(Mat, Mat)>,
    pub phi_key: Option<PhiWeights>,
    pub phi_value: Option<PhiWeights>,
    pub gate: Mat,
    pub gate_bias: Vec<f64>,
    pub output: Mat,
}

/// Result for a batch: output `[B][T][dim]` flattened per sequence, and the selected blocks
/// `selected[b][kv_head][t]` (ascending block indices).
#[derive(Clone, Debug)]
pub struct NsaReference {
    pub output: Vec<Vec<f64>>,
    pub selected: Vec<Vec<Vec<Vec<usize>>>>,
}

fn rope(v: &mut [f64], pos: usize, base: f64) {
    let d = v.len();
    for i in 0..d / 2 {
        let angle = pos as f64 * base.powf(-2.0 * i as f64 / d as f64);
        let (x0, x1) = (v[2 * i], v[2 * i + 1]);
        v[2 * i] = x0 * angle.cos() - x1 * angle.sin();
        v[2 * i + 1] = x0 * angle.sin() + x1 * angle.cos();
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Softmax attention of one query over a list of (key, value) pairs; also returns the
/// probabilities.
fn attend(q: &[f64], keys: &[&[f64]], values: &[&[f64]], d_v: usize) -> (Vec<f64>, Vec<f64>) {
    let scale = 1.0 / (q.len() as f64).sqrt();
    let logits: Vec<f64> = keys.iter().map(|k| q.iter().zip(*k).map(|(a, b)| a * b).sum::<f64>() * scale).collect();
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = exps.iter().sum();
    let probs: Vec<f64> = exps.iter().map(|e| e / total).collect();
    let mut out = vec![0.0; d_v];
    for (p, v) in probs.iter().zip(values) {
        for a in 0..d_v {
            out[a] += p * v[a];
        }
    }
    (out, probs)
}

fn slices(m: &[Vec<f64>]) -> Vec<&[f64]> {
    m.iter().map(|v| v.as_slice()).collect()
}

/// Per-head vectors of one token: `[H][d]`.
fn heads(row: Vec<f64>, h: usize) -> Vec<Vec<f64>> {
    let d = row.len() / h;
    (0..h).map(|i| row[i * d..(i + 1) * d].to_vec()).collect()
}

fn phi(block: &[&[f64]], weights: &Option<PhiWeights>) -> Vec<f64> {
    let h = block[0].len();
    // The block plus a position embedding, flattened token by token.
    let flat = |position: Option<&Mat>| -> Vec<f64> {
        block
            .iter()
            .enumerate()
            .flat_map(|(r, row)| (0..h).map(move |a| row[a] + position.map_or(0.0, |p| p.at(r, a))))
            .collect()
    };
    match weights {
        None => (0..h).map(|a| block.iter().map(|r| r[a]).sum::<f64>() / block.len() as f64).collect(),
        Some(PhiWeights::Linear { position, weight }) => weight.apply(&flat(position.as_ref())),
        Some(PhiWeights::Mlp { position, hidden, hidden_bias, output, output_bias }) => {
            let z = hidden.apply(&flat(Some(position)));
            let a: Vec<f64> = z.iter().zip(hidden_bias).map(|(z, b)| gelu(z + b)).collect();
            output.apply(&a).iter().zip(output_bias).map(|(y, b)| y + b).collect()
        }
    }
}

/// Top-n of the spec for query `t`, given the group score of every block.
pub fn select_blocks(t: usize, scores: &[f64], l_sel: usize, n: usize) -> Vec<usize> {
    let current = t / l_sel;
    let mut forced: Vec<usize> = vec![0, current];
    if current >= 1 {
        forced.push(current - 1);
    }
    forced.sort();
    forced.dedup();
    let mut rest: Vec<usize> = (0..=current).filter(|j| !forced.contains(j)).collect();
    // Highest score first, ties to the lower index.
    rest.sort_by(|a, b| scores[*b].partial_cmp(&scores[*a]).unwrap().then(a.cmp(b)));
    let mut chosen = forced.clone();
    chosen.extend(rest.into_iter().take(n.saturating_sub(forced.len())));
    chosen.sort();
    chosen
}

/// The NSA layer on `x[b]` (`[T][dim]` flattened), per the spec.
pub fn nsa_reference(c: &NsaConfig, w: &NsaWeights, x: &[Vec<f64>], t_len: usize) -> NsaReference {
    let (output, selected) = x.iter().map(|xb| sequence_reference(c, w, xb, t_len)).unzip();
    NsaReference { output, selected }
}

/// Per-token heads `[T][H][d]` of `m` applied to each token of `xb`, rotated at their positions
/// with RoPE base `rope_base` when given.
fn token_heads(m: &Mat, xb: &[f64], dim: usize, t_len: usize, h: usize, rope_base: Option<f64>) -> Vec<Vec<Vec<f64>>> {
    (0..t_len)
        .map(|t| {
            let mut row = heads(m.apply(&xb[t * dim..(t + 1) * dim]), h);
            if let Some(base) = rope_base {
                row.iter_mut().for_each(|v| rope(v, t, base));
            }
            row
        })
        .collect()
}

/// One sequence's output `[T * dim]` and, per KV head, each position's selected blocks.
fn sequence_reference(c: &NsaConfig, w: &NsaWeights, xb: &[f64], t_len: usize) -> (Vec<f64>, Vec<Vec<Vec<usize>>>) {
    let (hq, hkv, g, dv) = (c.n_heads, c.n_kv_heads, c.group_size(), c.d_v);
    let token = |t: usize| &xb[t * c.dim..(t + 1) * c.dim];
    let kv_of = |branch: usize| &w.kv[if c.shared_kv { 0 } else { branch }];
    // Queries and per-branch keys (rotated at their positions) and values: [T][H][d].
    let q = token_heads(&w.query, xb, c.dim, t_len, hq, Some(c.rope_base));
    let keys = |branch: usize| token_heads(&kv_of(branch).0, xb, c.dim, t_len, hkv, Some(c.rope_base));
    let values = |branch: usize| token_heads(&kv_of(branch).1, xb, c.dim, t_len, hkv, None);
    let (k_slc, v_slc) = (keys(1), values(1));
    let (k_win, v_win) = (keys(2), values(2));
    let k_cmp = compressed(c, &keys(0), &w.phi_key, t_len);
    let v_cmp = compressed(c, &values(0), &w.phi_value, t_len);
    let n_sel_blocks = t_len.div_ceil(c.l_sel);
    let mut out_b = Vec::with_capacity(t_len * c.dim);
    let mut selected_b = vec![Vec::new(); hkv];
    for t in 0..t_len {
        let n_cmp = if t + 1 < c.l { 0 } else { (t + 1 - c.l) / c.d + 1 };
        let gates: Vec<f64> = w.gate.apply(token(t)).iter().zip(&w.gate_bias).map(|(a, b)| sigmoid(a + b)).collect();
        let mut mixed = vec![0.0; hq * dv];
        for kh in 0..hkv {
            // Compressed branch for each head of the group, and the group's block scores.
            let mut group_score = vec![0.0; n_sel_blocks];
            let mut o_cmp = vec![vec![0.0; dv]; g];
            for gi in (0..g).filter(|_| n_cmp > 0) {
                let ks: Vec<&[f64]> = (0..n_cmp).map(|i| k_cmp[i][kh].as_slice()).collect();
                let vs: Vec<&[f64]> = (0..n_cmp).map(|i| v_cmp[i][kh].as_slice()).collect();
                let (o, p) = attend(&q[t][kh * g + gi], &ks, &vs, dv);
                o_cmp[gi] = o;
                add_block_scores(c, &p, &mut group_score);
            }
            let chosen = select_blocks(t, &group_score, c.l_sel, c.n);
            let sel_keys: Vec<usize> =
                chosen.iter().flat_map(|&j| j * c.l_sel..((j + 1) * c.l_sel).min(t + 1)).collect();
            let win_keys: Vec<usize> = (t.saturating_sub(c.w - 1)..=t).collect();
            selected_b[kh].push(chosen);
            let gather =
                |ks: &Vec<Vec<Vec<f64>>>, idx: &[usize]| idx.iter().map(|&p| ks[p][kh].clone()).collect::<Vec<_>>();
            let (sk, sv) = (gather(&k_slc, &sel_keys), gather(&v_slc, &sel_keys));
            let (wk, wv) = (gather(&k_win, &win_keys), gather(&v_win, &win_keys));
            for gi in 0..g {
                let h = kh * g + gi;
                let (o_slc, _) = attend(&q[t][h], &slices(&sk), &slices(&sv), dv);
                let (o_win, _) = attend(&q[t][h], &slices(&wk), &slices(&wv), dv);
                for a in 0..dv {
                    mixed[h * dv + a] =
                        gates[h] * o_cmp[gi][a] + gates[hq + h] * o_slc[a] + gates[2 * hq + h] * o_win[a];
                }
            }
        }
        out_b.extend(w.output.apply(&mixed));
    }
    (out_b, selected_b)
}

/// Compressed tokens `[N][H_kv][d]` of raw rows `[T][H_kv][d]` through `phi`.
fn compressed(c: &NsaConfig, raw: &[Vec<Vec<f64>>], weights: &Option<PhiWeights>, t_len: usize) -> Vec<Vec<Vec<f64>>> {
    let n_blocks = if t_len < c.l { 0 } else { (t_len - c.l) / c.d + 1 };
    (0..n_blocks)
        .map(|i| {
            (0..c.n_kv_heads)
                .map(|h| phi(&(i * c.d..i * c.d + c.l).map(|p| raw[p][h].as_slice()).collect::<Vec<_>>(), weights))
                .collect()
        })
        .collect()
}

/// Adds compressed probabilities `p` to the selection blocks' scores, each by its overlap share
/// (Eq. 9).
fn add_block_scores(c: &NsaConfig, p: &[f64], scores: &mut [f64]) {
    for (i, pi) in p.iter().enumerate() {
        for (j, score) in scores.iter_mut().enumerate() {
            let (a0, a1) = (i * c.d, i * c.d + c.l);
            let (b0, b1) = (j * c.l_sel, (j + 1) * c.l_sel);
            let overlap = a1.min(b1).saturating_sub(a0.max(b0));
            *score += pi * overlap as f64 / c.l as f64;
        }
    }
}

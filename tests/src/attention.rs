//! Float64 loop version of one attention branch over explicit key sets (spec: "Selected" and
//! "Sliding window"), with its gradients written out by hand: what the fused kernels and the
//! reference tensor path of `nsa-kernels` are held to.
//!
//! Layout `[B, T, H, d]` row-major, as the kernels take it; query head `h` reads KV head
//! `h / g`.

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub h_q: usize,
    pub h_kv: usize,
    pub d_k: usize,
    pub d_v: usize,
}

impl Dims {
    pub fn g(&self) -> usize {
        self.h_q / self.h_kv
    }
    fn q_at(&self, b: usize, t: usize, h: usize) -> usize {
        ((b * self.t + t) * self.h_q + h) * self.d_k
    }
    fn o_at(&self, b: usize, t: usize, h: usize) -> usize {
        ((b * self.t + t) * self.h_q + h) * self.d_v
    }
    fn k_at(&self, b: usize, s: usize, h: usize) -> usize {
        ((b * self.t + s) * self.h_kv + h) * self.d_k
    }
    fn v_at(&self, b: usize, s: usize, h: usize) -> usize {
        ((b * self.t + s) * self.h_kv + h) * self.d_v
    }
}

/// Keys `[t + 1 - w, t]` of the causal window.
pub fn window_keys(t: usize, w: usize) -> Vec<usize> {
    (t.saturating_sub(w - 1)..=t).collect()
}

/// Keys of the listed blocks (negative = unused), each clamped causally to `t`.
pub fn block_keys(t: usize, blocks: &[i64], l_sel: usize) -> Vec<usize> {
    let mut keys: Vec<usize> = blocks
        .iter()
        .filter(|&&j| j >= 0)
        .flat_map(|&j| (j as usize * l_sel..((j as usize + 1) * l_sel).min(t + 1)).collect::<Vec<_>>())
        .collect();
    keys.sort_unstable();
    keys
}

/// Output, log-sum-exp and the gradients of `sum(out * grad_out)`.
pub struct AttentionResult {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

/// `keys(b, t, hk)` lists the keys query row `(b, t, h)` attends (shared by the group).
pub fn attention(
    dims: Dims,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    grad_out: &[f64],
    keys: impl Fn(usize, usize, usize) -> Vec<usize>,
) -> AttentionResult {
    let Dims { b: nb, t: nt, h_q, d_k, d_v, .. } = dims;
    let scale = 1.0 / (d_k as f64).sqrt();
    let mut r = AttentionResult {
        out: vec![0.0; q.len() / d_k * d_v],
        lse: vec![0.0; q.len() / d_k],
        dq: vec![0.0; q.len()],
        dk: vec![0.0; k.len()],
        dv: vec![0.0; v.len()],
    };
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for b in 0..nb {
        for t in 0..nt {
            for h in 0..h_q {
                let hk = h / dims.g();
                let ks = keys(b, t, hk);
                let qa = dims.q_at(b, t, h);
                let qrow = &q[qa..qa + d_k];
                let scores: Vec<f64> =
                    ks.iter().map(|&s| dot(qrow, &k[dims.k_at(b, s, hk)..][..d_k]) * scale).collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|x| (x - max).exp()).sum();
                let lse = max + sum.ln();
                let p: Vec<f64> = scores.iter().map(|x| (x - lse).exp()).collect();
                let oa = dims.o_at(b, t, h);
                for (&s, &pi) in ks.iter().zip(&p) {
                    for i in 0..d_v {
                        r.out[oa + i] += pi * v[dims.v_at(b, s, hk) + i];
                    }
                }
                r.lse[(b * nt + t) * h_q + h] = lse;
                let dout = &grad_out[oa..oa + d_v];
                let delta = dot(dout, &r.out[oa..oa + d_v]);
                for (&s, &pi) in ks.iter().zip(&p) {
                    let (ka, va) = (dims.k_at(b, s, hk), dims.v_at(b, s, hk));
                    let ds = pi * (dot(dout, &v[va..va + d_v]) - delta);
                    for i in 0..d_v {
                        r.dv[va + i] += pi * dout[i];
                    }
                    for i in 0..d_k {
                        r.dq[qa + i] += ds * k[ka + i] * scale;
                        r.dk[ka + i] += ds * qrow[i] * scale;
                    }
                }
            }
        }
    }
    r
}

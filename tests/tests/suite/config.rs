//! Config validation and TOML loading: one-line errors naming the field.

use nsa_core::{AttentionKind, NsaConfig, NsaLmConfig};

fn assert_rejected(cfg: NsaConfig, field: &str) {
    let err = cfg.validate().expect_err("config should be rejected");
    assert_eq!(err.field, field, "{err}");
    let line = err.to_string();
    assert!(!line.contains('\n') && line.contains(field), "not a one-line error naming `{field}`: {line}");
}

#[test]
fn invalid_nsa_values_are_rejected_naming_the_field() {
    let ok = NsaConfig::new();
    ok.validate().unwrap();
    assert_rejected(ok.clone().with_d(0), "d");
    assert_rejected(ok.clone().with_l(24), "l"); // not a multiple of d = 16
    assert_rejected(ok.clone().with_l(8).with_d(16).with_l_sel(64), "l"); // l < d
    assert_rejected(ok.clone().with_l_sel(40), "l_sel");
    assert_rejected(ok.clone().with_l_sel(0), "l_sel");
    assert_rejected(ok.clone().with_n(2), "n");
    assert_rejected(ok.clone().with_w(0), "w");
    assert_rejected(ok.clone().with_n_kv_heads(5), "n_heads");
    assert_rejected(ok.clone().with_n_kv_heads(0), "n_kv_heads");
    assert_rejected(ok.clone().with_d_k(63), "d_k");
    assert_rejected(ok.clone().with_d_v(0), "d_v");
    assert_rejected(ok.clone().with_gate_init(1.0), "gate_init");
    assert_rejected(ok.clone().with_rope_base(f64::NAN), "rope_base");
    // Dense attention ignores the sparse-only fields.
    ok.with_n(0).with_attention(AttentionKind::Dense).validate().unwrap();
}

fn load(text: &str) -> Result<NsaLmConfig, nsa_core::ConfigError> {
    NsaLmConfig::from_table(&text.parse().unwrap(), &[])
}

fn assert_toml_error(text: &str, field: &str) {
    let err = load(text).expect_err("should be rejected");
    assert_eq!(err.field, field, "{err}");
    assert!(!err.to_string().contains('\n'), "{err}");
}

#[test]
fn toml_errors_are_one_line_and_name_the_key() {
    assert_toml_error("[model.attention]\nl = 24\n", "model.attention.l");
    assert_toml_error("[model.attention]\nwindow = 4\n", "model.attention.window");
    assert_toml_error("[model]\nlayers = 4\n", "model.layers");
    assert_toml_error("[model.attention]\nw = \"wide\"\n", "model.attention.w");
    assert_toml_error("[model.attention]\nphi = \"max\"\n", "model.attention.phi");
    assert_toml_error("[model]\nn_layers = -1\n", "model.n_layers");
    assert_toml_error("[model]\nn_layers = 0\n", "model.n_layers");
    assert_toml_error("[optimizer]\nlr = 1\n", "optimizer");
    let missing = NsaLmConfig::load_toml("configs/does-not-exist.toml").unwrap_err();
    assert!(missing.to_string().contains("does-not-exist.toml"), "{missing}");
}

#[test]
fn partial_toml_keeps_defaults_and_integers_fill_floats() {
    let cfg = load("[model]\nn_layers = 3\n[model.attention]\nrope_base = 500000\n").unwrap();
    assert_eq!(cfg.n_layers, 3);
    assert_eq!(cfg.attention.rope_base, 500000.0);
    assert_eq!(cfg.attention.w, NsaConfig::new().w);
}

fn shipped(name: &str) -> NsaLmConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/").to_string() + name;
    let table = nsa_core::toml_config::read_table(std::path::Path::new(&path)).unwrap();
    NsaLmConfig::from_table(&table, &["train", "data"]).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn shipped_configs_load_and_match_the_production_shape() {
    let tiny = shipped("tiny.toml");
    assert!(tiny.attention.dim <= 128 && tiny.n_layers <= 4);
    let prod = shipped("nsa-125m.toml");
    let a = &prod.attention;
    assert_eq!((a.dim, prod.n_layers, a.n_heads, a.n_kv_heads, a.d_k, a.d_v), (768, 12, 12, 2, 64, 64));
    assert_eq!((a.l, a.d, a.l_sel, a.n, a.w), (32, 16, 64, 16, 512));
    assert_eq!((prod.vocab_size, prod.seq_len, a.attention), (256, 2048, AttentionKind::Nsa));
    let dense = shipped("nsa-125m-dense.toml");
    assert_eq!(dense.attention.attention, AttentionKind::Dense);
    assert_eq!(dense.clone().with_attention(a.clone()), prod);
}

//! Generation with the decode cache: greedy tokens equal those of recomputing the whole context
//! for every token (the training forward); sampling is reproducible from its seed; a prompt past
//! the model's length is an error; a model trained on packed documents continues the last
//! document of a prompt that holds several.

use burn::backend::Flex;
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Int, Tensor, TensorData};
use nsa_core::{NsaLm, NsaLmConfig, Phi};
use nsa_train::data::corpus::Packing;
use nsa_train::generate::{generate, EndOfText, SampleOptions, TextStream};

use crate::common;

type Cpu = Flex;

/// The small model; `loud` scales its weights (see [`Louder`]).
fn model(phi: Phi, loud: bool) -> NsaLm<Cpu> {
    let attention = common::small_attention().with_phi(phi);
    let cfg = NsaLmConfig::new().with_vocab_size(40).with_n_layers(2).with_seq_len(64).with_attention(attention);
    cfg.validate().unwrap();
    let model = cfg.init::<Cpu>(&Default::default());
    if loud {
        model.map(&mut Louder)
    } else {
        model
    }
}

/// Weights 20x their initial scale: logits far apart, so no greedy choice rests on a near-tie
/// that f32 rounding could flip between two exact evaluation orders.
struct Louder;

impl ModuleMapper<Cpu> for Louder {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Cpu, D>>) -> Param<Tensor<Cpu, D>> {
        param.map(|tensor| tensor.mul_scalar(20.0))
    }
}

fn options(max_tokens: usize, temperature: f64) -> SampleOptions {
    SampleOptions { max_tokens, temperature, top_k: 0, top_p: 0.9, seed: 7 }
}

/// Greedy continuation by a full forward over the whole context for every token.
fn greedy_without_cache(model: &NsaLm<Cpu>, prompt: &[u32], tokens: usize) -> Vec<u32> {
    let mut context = prompt.to_vec();
    for _ in 0..tokens {
        let ids: Vec<i64> = context.iter().map(|&t| i64::from(t)).collect();
        let t = ids.len();
        let input = Tensor::<Cpu, 2, Int>::from_data(TensorData::new(ids, [1, t]), &Default::default());
        let logits: Vec<f32> = model.forward(input).narrow(1, t - 1, 1).into_data().to_vec().unwrap();
        let best = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a))).unwrap();
        context.push(best as u32);
    }
    context[prompt.len()..].to_vec()
}

#[test]
fn greedy_generation_with_the_cache_equals_recomputing_the_context() {
    for phi in [Phi::Avg, Phi::Mlp] {
        let model = model(phi, true);
        let prompt: Vec<u32> = vec![3, 17, 9, 1, 22];
        let want = greedy_without_cache(&model, &prompt, 40);
        let mut streamed = Vec::new();
        let got =
            generate(&model, &[prompt], &options(40, 0.0), None, &Default::default(), |_, t| streamed.push(t)).unwrap();
        assert_eq!(got.tokens[0], want, "{phi:?}");
        assert_eq!(streamed, want, "every token is streamed as it is drawn");
        assert_eq!((got.prefill_tokens, got.decode_tokens), (5, 39));
    }
}

#[test]
fn sampling_is_reproducible_and_stops_at_end_of_text() {
    // At its initial scale the model's next-token distribution is nearly flat: draws vary.
    let model = model(Phi::Linear, false);
    let prompts = vec![vec![5, 6, 7], vec![5, 6, 7]];
    let run = |seed| {
        let opts = SampleOptions { seed, ..options(30, 1.0) };
        generate(&model, &prompts, &opts, None, &Default::default(), |_, _| {}).unwrap().tokens
    };
    assert_eq!(run(1), run(1), "the same seed draws the same tokens");
    assert_ne!(run(1), run(2), "another seed draws others");
    let first = run(1)[0][0];
    let stopped = generate(
        &model,
        &prompts[..1],
        &SampleOptions { seed: 1, ..options(30, 1.0) },
        Some(EndOfText { id: first, packing: Packing::Stream }),
        &Default::default(),
        |_, _| {},
    )
    .unwrap();
    assert!(stopped.tokens[0].is_empty(), "a sequence stops at its end-of-text token, which is not kept");
}

#[test]
fn a_prompt_longer_than_the_model_is_an_error_and_the_length_stops_generation() {
    let model = model(Phi::Avg, false);
    let err = generate(&model, &[vec![1; 65]], &options(5, 0.0), None, &Default::default(), |_, _| {}).unwrap_err();
    assert!(err.contains("longer than the model's seq_len of 64"), "{err}");
    let done = generate(&model, &[vec![1; 60]], &options(10, 0.0), None, &Default::default(), |_, _| {}).unwrap();
    assert_eq!(done.tokens[0].len(), 5, "positions 60..63 hold tokens 1-4, the fifth is drawn from position 63");
    assert!(done.hit_length);
}

/// A prompt of three documents: a model trained on packed documents continues the last as if it
/// were the whole prompt (the decode tests of `nsa-tests` hold that to the packed forward), one
/// trained on a stream continues all of it; the documents before the last may together be
/// longer than the model.
#[test]
fn a_packed_model_continues_the_last_document_of_its_prompt() {
    const EOT: u32 = 39;
    let model = model(Phi::Avg, true);
    let last: Vec<u32> = vec![3, 17, 9, 1, 22];
    let mut prompt: Vec<u32> = (0..70).map(|i| i % 30).collect();
    prompt.insert(40, EOT);
    prompt.push(EOT);
    prompt.extend(&last);
    let run = |prompt: &[u32], packing| {
        let end_of_text = Some(EndOfText { id: EOT, packing });
        generate(&model, &[prompt.to_vec()], &options(20, 0.0), end_of_text, &Default::default(), |_, _| {})
    };
    let packed = run(&prompt, Packing::Documents).unwrap();
    assert_eq!(packed.tokens, run(&last, Packing::Documents).unwrap().tokens);
    assert_eq!(packed.tokens[0], greedy_without_cache(&model, &last, packed.tokens[0].len()));
    assert_eq!(packed.prefill_tokens, last.len(), "only the last document is prefilled");

    let streamed = &prompt[prompt.len() - 30..];
    let want = greedy_without_cache(&model, streamed, 20);
    let want: Vec<u32> = want.into_iter().take_while(|&t| t != EOT).collect();
    assert_eq!(run(streamed, Packing::Stream).unwrap().tokens[0], want, "a stream model reads across documents");
    let err = run(&prompt, Packing::Stream).unwrap_err();
    assert!(err.contains("longer than the model's seq_len"), "{err}");

    let err = run(&prompt[..prompt.len() - last.len()], Packing::Documents).unwrap_err();
    assert!(err.contains("ends with the end-of-text token"), "{err}");
}

#[test]
fn streamed_text_waits_for_whole_characters() {
    let decode = |ids: &[u32]| String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<_>>()).into_owned();
    let mut stream = TextStream::default();
    let bytes = "aé€".as_bytes();
    let pieces: Vec<String> = bytes.iter().map(|&b| stream.push(u32::from(b), decode)).collect();
    assert_eq!(pieces.concat(), "aé€");
    assert_eq!(pieces[1], "", "the first byte of é waits for the second");
}

//! A layer given an input it cannot take says so by its name in the model
//! (its scope path) and in its own terms, dtypes as "expected the layer's,
//! got the input's". The models run on the meta device: no data needed.
use leangrad::memory::scope;
use leangrad::models::{ResNet, ResNetConfig, Vgg, VggConfig};
use leangrad::nn::{BatchNorm, Conv2d, LayerNorm, Linear, Module};
use leangrad::{DType, Device, Error, Result, Tensor};

const META: Device = Device::Meta;

fn meta(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, META).unwrap()
}

/// The message of an `Error::LayerInput` naming `layer`.
fn layer_error(r: Result<Tensor>, layer: &str) -> String {
    match r {
        Err(e @ Error::LayerInput { .. }) => {
            let Error::LayerInput { layer: l, .. } = &e else {
                unreachable!()
            };
            assert_eq!(l, layer);
            e.to_string()
        }
        other => panic!("expected LayerInput from {layer}, got {other:?}"),
    }
}

#[test]
fn models_built_by_name_report_the_layer_at_fault() {
    let resnet = ResNet::new(ResNetConfig::resnet18(10), DType::F32, META, 0).unwrap();
    let grey = resnet.forward(&meta(&[2, 1, 32, 32], DType::F32));
    assert_eq!(
        layer_error(grey, "conv1"),
        "conv1 expects 3 input channels, got 1 (input shape [2, 1, 32, 32])"
    );
    let doubles = resnet.forward(&meta(&[2, 3, 32, 32], DType::F64));
    assert_eq!(
        layer_error(doubles, "conv1"),
        "conv1 expects F32 input (its parameters' dtype), got F64"
    );
    let unbatched = resnet.forward(&meta(&[3, 32, 32], DType::F32));
    assert_eq!(
        layer_error(unbatched, "conv1"),
        "conv1 expects a 4-d input [N, C, H, W], got shape [3, 32, 32]"
    );
    let vgg = Vgg::new(&VggConfig::vgg16(true, 10), DType::F32, META, 0).unwrap();
    let grey = vgg.forward(&meta(&[1, 1, 32, 32], DType::F32));
    assert!(layer_error(grey, "features.0").starts_with("features.0 expects 3 input channels"));
}

#[test]
fn linear_norm_and_nested_layers_name_themselves() {
    let fc = Linear::builder(512, 10).name("fc").build(&META).unwrap();
    assert_eq!(
        layer_error(fc.forward(&meta(&[4, 256], DType::F32)), "fc"),
        "fc expects 512 input features (last dim), got 256 (input shape [4, 256])"
    );
    let bn = BatchNorm::builder(64).name("bn1").build2d(&META).unwrap();
    assert_eq!(
        layer_error(bn.forward(&meta(&[2, 32, 4, 4], DType::F32)), "bn1"),
        "bn1 expects 64 channels (dim 1), got 32 (input shape [2, 32, 4, 4])"
    );
    assert_eq!(
        layer_error(bn.forward(&meta(&[2, 64], DType::F32)), "bn1"),
        "bn1 expects a 4-d input [N, C, H, W], got shape [2, 64]"
    );
    let ln = LayerNorm::builder(&[768])
        .name("ln_f")
        .build(&META)
        .unwrap();
    assert_eq!(
        layer_error(ln.forward(&meta(&[2, 8, 512], DType::F32)), "ln_f"),
        "ln_f expects an input whose last dims are [768] (its normalized shape), got shape [2, 8, 512]"
    );
    // Inside a model, the path is the scopes the layer runs in.
    let conv = Conv2d::builder(64, 64, 3)
        .name("conv1")
        .build(&META)
        .unwrap();
    let _block = scope("layer1.0");
    let r = conv.forward(&meta(&[1, 32, 8, 8], DType::F32));
    assert!(layer_error(r, "layer1.0.conv1")
        .starts_with("layer1.0.conv1 expects 64 input channels, got 32"));
}

// Pixels -> the model's input, as keras-vit computes it in Python: the image brought to the
// model's size by the model's evaluation transform (keras_vit.model.transform: timm's resize and
// centre crop, with Pillow's filters and fixed-point weights, each pass stored in 8 bits), then the normalisation from the model's metadata. Matching Python here keeps the
// phone's answers equal to LiteRT's in Python for the same picture. No browser APIs: node can
// test it.

// The contract's resize rule this file ports, as model.json names it: the page refuses a
// model.json that names another (tests hold the two names equal).
export const RESIZE = 'antialiased resize, then centre crop';

// The filters by the transform's interpolation: [kernel, radius], in Pillow's operation order
// (keras_vit.data.images.KERNELS). Keys' cubic with a = -0.5 is Pillow's bicubic.
const KERNELS = {
  bilinear: [(x) => (Math.abs(x) < 1 ? 1 - Math.abs(x) : 0), 1],
  bicubic: [bicubic, 2],
};

function bicubic(x) {
  x = Math.abs(x);
  if (x < 1) return ((-0.5 + 2) * x - (-0.5 + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * -0.5;
  return 0;
}

// Pillow's fixed point: weights in units of 2**-22, sums rounded half up (keras_vit.data.images).
const PRECISION = 2 ** 22;

// Where an image of height x width goes (keras_vit.model.transform.Transform.plan): the size it
// is resized to and the corner of the model's crop in it, in timm's integer arithmetic.
export function plan(height, width, outHeight, outWidth, transform) {
  const {crop_pct: cropPct, crop_mode: cropMode} = transform;
  const scaleH = Math.floor(outHeight / cropPct);
  const scaleW = Math.floor(outWidth / cropPct);
  let resized;
  if (cropMode === 'squash') {
    resized = [scaleH, scaleW];
  } else if (scaleH === scaleW) {
    resized = width <= height ? [Math.trunc((scaleH * height) / width), scaleW] : [scaleH, Math.trunc((scaleW * width) / height)];
  } else {
    const ratio = Math.min(height / scaleH, width / scaleW);
    resized = [roundHalfToEven(height / ratio), roundHalfToEven(width / ratio)];
  }
  return {resized, top: roundHalfToEven((resized[0] - outHeight) / 2), left: roundHalfToEven((resized[1] - outWidth) / 2)};
}

// Pillow's resize weights (keras_vit.data.images.filter_weights): half-pixel centres; when
// shrinking, the kernel widens by the scale so every source pixel counts; each output's weights
// normalised in order, then fixed-point (whole numbers). Only outputs start .. start + count are
// kept (the crop).
export function resizeSpans(inputSize, outputSize, interpolation = 'bilinear', start = 0, count = outputSize) {
  const [kernel, radius] = KERNELS[interpolation];
  const scale = inputSize / outputSize;
  const kernelScale = Math.max(scale, 1);
  const inverseWidth = 1 / kernelScale;
  const spans = [];
  for (let x = start; x < start + count; x++) {
    const centre = (x + 0.5) * scale;
    const first = clamp(Math.floor(centre - radius * kernelScale), 0, inputSize - 1);
    const last = clamp(Math.ceil(centre + radius * kernelScale), 0, inputSize - 1);
    const weights = new Float64Array(last - first + 1);
    let total = 0;
    for (let source = first; source <= last; source++) {
      const weight = kernel((source - centre + 0.5) * inverseWidth);
      weights[source - first] = weight;
      total += weight;
    }
    for (let i = 0; i < weights.length; i++) {
      const weight = total !== 0 ? weights[i] / total : weights[i];
      weights[i] = Math.trunc(weight * PRECISION + (weight < 0 ? -0.5 : 0.5));
    }
    spans.push({start: first, weights});
  }
  return spans;
}

function clamp(value, low, high) {
  return Math.min(Math.max(value, low), high);
}

// NumPy's rounding (ties to even), as the Python runtime quantises and timm's crop rounds.
function roundHalfToEven(value) {
  const rounded = Math.round(value);
  return Math.abs(value % 1) === 0.5 && rounded % 2 !== 0 ? rounded - 1 : rounded;
}

// A pass's sum of pixels times fixed-point weights as Pillow stores it: rounded half up, clipped
// to [0, 255]. Whole numbers below 2**53 add up exactly in any order, as in Python.
function to8Bits(sum) {
  return clamp(Math.floor((sum + PRECISION / 2) / PRECISION), 0, 255);
}

const PLAIN_RESIZE = {crop_pct: 1, crop_mode: 'squash', interpolation: 'bilinear'};

// RGBA bytes (canvas ImageData order) of a width x height image -> float RGB values in
// [0, 255] at outWidth x outHeight by the model's transform, row-major (height, width, 3):
// the width first, then the height; a side that keeps its size is not filtered.
export function resizeRgba(rgba, width, height, outWidth, outHeight, transform = PLAIN_RESIZE) {
  const {resized, top, left} = plan(height, width, outHeight, outWidth, transform);
  // Columns first (height x outWidth x 3), then rows.
  const wide = new Float64Array(height * outWidth * 3);
  const columns = resized[1] === width ? null : resizeSpans(width, resized[1], transform.interpolation, left, outWidth);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < outWidth; x++) {
      const i = (y * outWidth + x) * 3;
      if (columns === null) {
        const j = (y * width + left + x) * 4;
        wide[i] = rgba[j];
        wide[i + 1] = rgba[j + 1];
        wide[i + 2] = rgba[j + 2];
        continue;
      }
      const {start, weights} = columns[x];
      let r = 0, g = 0, b = 0;
      for (let k = 0; k < weights.length; k++) {
        const j = (y * width + start + k) * 4;
        r += weights[k] * rgba[j];
        g += weights[k] * rgba[j + 1];
        b += weights[k] * rgba[j + 2];
      }
      wide[i] = to8Bits(r);
      wide[i + 1] = to8Bits(g);
      wide[i + 2] = to8Bits(b);
    }
  }
  const out = new Float32Array(outWidth * outHeight * 3);
  const rows = resized[0] === height ? null : resizeSpans(height, resized[0], transform.interpolation, top, outHeight);
  for (let y = 0; y < outHeight; y++) {
    for (let x = 0; x < outWidth; x++) {
      const i = (y * outWidth + x) * 3;
      if (rows === null) {
        const j = ((top + y) * outWidth + x) * 3;
        out[i] = wide[j];
        out[i + 1] = wide[j + 1];
        out[i + 2] = wide[j + 2];
        continue;
      }
      const {start, weights} = rows[y];
      let r = 0, g = 0, b = 0;
      for (let k = 0; k < weights.length; k++) {
        const j = ((start + k) * outWidth + x) * 3;
        r += weights[k] * wide[j];
        g += weights[k] * wide[j + 1];
        b += weights[k] * wide[j + 2];
      }
      out[i] = to8Bits(r);
      out[i + 1] = to8Bits(g);
      out[i + 2] = to8Bits(b);
    }
  }
  return out;
}

// Float RGB pixels -> the input tensor's values: the metadata's (x - mean) / std per channel,
// then quantisation when the model takes integers (scale and zero point from the model).
export function toModelInput(pixels, model) {
  const mean = model.mean.length === 1 ? [model.mean[0], model.mean[0], model.mean[0]] : model.mean;
  const std = model.std.length === 1 ? [model.std[0], model.std[0], model.std[0]] : model.std;
  const normalised = new Float32Array(pixels.length);
  for (let i = 0; i < pixels.length; i++) {
    const c = i % 3;
    normalised[i] = (pixels[i] - mean[c]) / std[c];
  }
  const {dtype, scale, zeroPoint} = model.input;
  if (dtype === 'float32') return normalised;
  const [Type, low, high] = {uint8: [Uint8Array, 0, 255], int8: [Int8Array, -128, 127]}[dtype];
  const quantised = new Type(normalised.length);
  for (let i = 0; i < normalised.length; i++) {
    const value = scale ? normalised[i] / scale + zeroPoint : normalised[i];
    quantised[i] = clamp(roundHalfToEven(value), low, high);
  }
  return quantised;
}

// Output values -> probabilities (dequantised for integer outputs).
export function toProbabilities(values, model) {
  const {dtype, scale, zeroPoint} = model.output;
  if (dtype === 'float32') return Float32Array.from(values);
  return Float32Array.from(values, (v) => (v - zeroPoint) * scale);
}

// The k best classes, best first: [{index, name, probability}].
export function topK(probabilities, labels, k) {
  const order = Array.from(probabilities.keys()).sort((a, b) => probabilities[b] - probabilities[a] || a - b);
  return order.slice(0, k).map((index) => ({index, name: labels[index] ?? `class ${index}`, probability: probabilities[index]}));
}

// Whether a GPU's probabilities are the CPU's: the same top-k classes in the same order and
// every probability within `tolerance`. LiteRT's GPU path has returned wrong answers without an
// error (google-ai-edge/LiteRT #8913, BATCH_MATMUL's adj_x/adj_y), and a ViT's attention is
// made of BATCH_MATMUL: the app checks before it trusts the GPU.
export function sameAnswers(gpu, cpu, k, tolerance) {
  const order = (values) => Array.from(values.keys()).sort((a, b) => values[b] - values[a]).slice(0, k);
  const maxDifference = Math.max(...Array.from(gpu, (value, i) => Math.abs(value - cpu[i])));
  const sameTopK = order(gpu).join() === order(cpu).join();
  return {agree: sameTopK && maxDifference <= tolerance, sameTopK, maxDifference};
}

// A fixed test image for that check: pseudo-random pixels in [0, 255] (a blank image would
// hide a wrong matrix product), the same on every device.
export function testPattern(height, width) {
  const pixels = new Float32Array(height * width * 3);
  let state = 12345;
  for (let i = 0; i < pixels.length; i++) {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    pixels[i] = (state >>> 16) % 256;
  }
  return pixels;
}

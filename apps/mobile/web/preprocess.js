// Pixels -> the model's input, as keras-vit computes it in Python: the whole image resized
// to the model's size by the model's input contract (keras_vit.data.contract: TensorFlow's
// antialiased bilinear filter), then the normalisation from the model's metadata. Matching
// Python here keeps the phone's answers equal to LiteRT's in Python for the same picture.
// No browser APIs: node can test it.

// The contract's resize rule this file ports, as model.json names it: the page refuses a
// model.json that names another (tests hold the two names equal).
export const RESIZE = 'bilinear, antialiased';

// TensorFlow's ScaleAndTranslate spans for the triangle kernel (radius 1), half-pixel
// centres; when shrinking, the kernel widens by the scale so every source pixel counts.
export function resizeSpans(inputSize, outputSize) {
  const inverseScale = inputSize / outputSize;
  const kernelScale = Math.max(inverseScale, 1);
  const spans = [];
  for (let x = 0; x < outputSize; x++) {
    const sample = (x + 0.5) * inverseScale;
    const start = clamp(Math.ceil(sample - kernelScale - 0.5), 0, inputSize - 1);
    const end = clamp(Math.floor(sample + kernelScale - 0.5), 0, inputSize - 1) + 1;
    const weights = new Float64Array(end - start);
    let total = 0;
    for (let source = start; source < end; source++) {
      const weight = Math.max(0, 1 - Math.abs((source + 0.5 - sample) / kernelScale));
      weights[source - start] = weight;
      total += weight;
    }
    if (total > 0) for (let i = 0; i < weights.length; i++) weights[i] /= total;
    spans.push({start, weights});
  }
  return spans;
}

function clamp(value, low, high) {
  return Math.min(Math.max(value, low), high);
}

// NumPy's rounding (ties to even), as the Python runtime quantises.
function roundHalfToEven(value) {
  const rounded = Math.round(value);
  return Math.abs(value % 1) === 0.5 && rounded % 2 !== 0 ? rounded - 1 : rounded;
}

// RGBA bytes (canvas ImageData order) of a width x height image -> float RGB values in
// [0, 255] at outWidth x outHeight, row-major (height, width, 3). Same size: no filtering.
export function resizeRgba(rgba, width, height, outWidth, outHeight) {
  const out = new Float32Array(outWidth * outHeight * 3);
  if (width === outWidth && height === outHeight) {
    for (let i = 0, j = 0; i < out.length; i += 3, j += 4) {
      out[i] = rgba[j];
      out[i + 1] = rgba[j + 1];
      out[i + 2] = rgba[j + 2];
    }
    return out;
  }
  // Columns first (height x outWidth x 3), then rows.
  const columns = resizeSpans(width, outWidth);
  const rows = resizeSpans(height, outHeight);
  const wide = new Float64Array(height * outWidth * 3);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < outWidth; x++) {
      const {start, weights} = columns[x];
      let r = 0, g = 0, b = 0;
      for (let k = 0; k < weights.length; k++) {
        const j = (y * width + start + k) * 4;
        r += weights[k] * rgba[j];
        g += weights[k] * rgba[j + 1];
        b += weights[k] * rgba[j + 2];
      }
      const i = (y * outWidth + x) * 3;
      wide[i] = r;
      wide[i + 1] = g;
      wide[i + 2] = b;
    }
  }
  for (let y = 0; y < outHeight; y++) {
    const {start, weights} = rows[y];
    for (let x = 0; x < outWidth; x++) {
      let r = 0, g = 0, b = 0;
      for (let k = 0; k < weights.length; k++) {
        const j = ((start + k) * outWidth + x) * 3;
        r += weights[k] * wide[j];
        g += weights[k] * wide[j + 1];
        b += weights[k] * wide[j + 2];
      }
      const i = (y * outWidth + x) * 3;
      out[i] = r;
      out[i + 1] = g;
      out[i + 2] = b;
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

// keras-vit's mobile classifier: runs the exported .tflite on the device with LiteRT.js.
// Everything about the model (file, class names, image size, normalisation, input and
// output types, how many classes to list) comes from model.json, which `keras-vit app mobile` reads out of the
// .tflite's own metadata.

import {isWebGPUSupported, loadAndCompile, loadLiteRt, Tensor} from '@litertjs/core';
import {RESIZE, resizeRgba, sameAnswers, testPattern, toModelInput, toProbabilities, topK} from './preprocess.js';

const MAX_SIDE = 2048; // photos are read at most this large, as keras_vit.data.images.load_image does
const LIVE_MAX_SIDE = 640; // camera frames: small enough to classify many per second
const WASM_FOLDER = './vendor/@litertjs/core/wasm/';
const ACCELERATOR_NAMES = {wasm: 'CPU (WebAssembly)', webgpu: 'GPU (WebGPU)'};
// The GPU is used only when its probabilities on a test image are the CPU's to within this.
const GPU_TOLERANCE = 1e-3;

const $ = (id) => document.getElementById(id);

// The app's state; tests and users' scripts read it as `window.kerasVit`.
const app = {
  info: null,
  model: null,
  accelerator: null,
  outputIndex: 0,
  results: 0, // classifications shown so far
  lastInput: null, // the last image as the model saw it: float RGB, (height, width, 3)
  lastProbabilities: null,
  live: null, // {stream, frames} while the camera runs
  ready: null,
  gpuCheck: null, // {agree, sameTopK, maxDifference} when the GPU was tried
};
window.kerasVit = app;

function showError(message) {
  const box = $('error');
  box.textContent = message;
  box.hidden = false;
}

function clearError() {
  $('error').hidden = true;
  $('error').textContent = '';
}

function setStatus(text) {
  $('status').textContent = text;
}

// ---- the model -------------------------------------------------------------------------

async function fetchOrExplain(url, what) {
  let response;
  try {
    response = await fetch(url);
  } catch {
    throw new Error(`${what} could not be fetched (${url}): the server is not reachable and the app is not cached yet.`);
  }
  if (!response.ok) {
    throw new Error(`${what} could not be fetched (${url}: HTTP ${response.status}). Start the app with \`keras-vit app mobile --model PATH\`.`);
  }
  return response;
}

async function chooseAccelerator() {
  // ?accelerator=wasm forces the CPU; by default WebGPU is used where the device has a GPU.
  // LiteRT.js runs WebGPU from its JSPI build only (WebAssembly.Suspending): elsewhere, the CPU.
  const asked = new URLSearchParams(location.search).get('accelerator');
  if (asked === 'wasm') return asked;
  if (!isWebGPUSupported() || !('Suspending' in WebAssembly)) return 'wasm';
  if (asked === 'webgpu') return asked;
  const adapter = await navigator.gpu.requestAdapter().catch(() => null);
  return adapter ? 'webgpu' : 'wasm';
}

async function compile(bytes, accelerator, file) {
  try {
    return [await loadAndCompile(bytes, {accelerator}), accelerator];
  } catch (error) {
    if (accelerator === 'webgpu') {
      console.warn('WebGPU could not compile the model; using the CPU.', error);
      return compile(bytes, 'wasm', file);
    }
    throw new Error(`${file} could not be loaded by LiteRT.js (${error.message || error}). Re-export it with \`keras-vit export\`.`);
  }
}

// The GPU's answer on a test image against the CPU's: [model, accelerator], the GPU's only
// when they agree (app.gpuCheck says how close they were, or what failed on the GPU).
async function checkedGpu(gpuModel, bytes, info) {
  const cpuModel = await loadAndCompile(bytes, {accelerator: 'wasm'});
  const [height, width] = info.imageSize;
  const input = toModelInput(testPattern(height, width), info);
  try {
    app.model = gpuModel;
    const gpuAnswer = toProbabilities(await run(input), info);
    app.model = cpuModel;
    const cpuAnswer = toProbabilities(await run(input), info);
    app.gpuCheck = sameAnswers(gpuAnswer, cpuAnswer, info.topK, GPU_TOLERANCE);
  } catch (error) {
    app.gpuCheck = {agree: false, error: String(error.message || error)};
  }
  (app.gpuCheck.agree ? cpuModel : gpuModel).delete();
  return app.gpuCheck.agree ? [gpuModel, 'webgpu'] : [cpuModel, 'wasm'];
}

async function loadModel() {
  const info = await (await fetchOrExplain('model.json', 'The model description')).json();
  if (info.resize !== RESIZE) {
    throw new Error(`model.json asks for the resize "${info.resize}"; this page does "${RESIZE}": rebuild the app with the keras-vit that exported the model.`);
  }
  const bytes = new Uint8Array(await (await fetchOrExplain(info.file, 'The model')).arrayBuffer());
  const wanted = await chooseAccelerator();
  await loadLiteRt(WASM_FOLDER, wanted === 'webgpu' ? {jspi: true} : {});
  let [model, accelerator] = await compile(bytes, wanted, info.file);

  const [height, width] = info.imageSize;
  const inputShape = Array.from(model.getInputDetails()[0].shape);
  if (inputShape.join() !== [1, height, width, 3].join()) {
    throw new Error(`${info.file} takes input of shape [${inputShape}], not [1, ${height}, ${width}, 3]; re-export it with \`keras-vit export\`.`);
  }
  // Probabilities are (1, classes); a model exported with --attention adds a map.
  const outputs = model.getOutputDetails();
  app.outputIndex = outputs.findIndex((output) => output.shape.length === 2);
  if (app.outputIndex < 0 || outputs[app.outputIndex].shape[1] !== info.labels.length) {
    throw new Error(`${info.file} has no output of ${info.labels.length} class probabilities.`);
  }
  Object.assign(app, {info, model, accelerator});
  if (accelerator === 'webgpu') [model, accelerator] = await checkedGpu(model, bytes, info);
  Object.assign(app, {model, accelerator});
  // One run on a blank image: the first run sets up the kernels, and should not count as a photo's time.
  await run(toModelInput(new Float32Array(height * width * 3), info));
  $('model-name').textContent = info.name;
  document.title = `${info.name} · keras-vit`;
  setStatus(`${info.labels.length} classes · ${width}×${height} · LiteRT.js on ${ACCELERATOR_NAMES[accelerator]}${whyNotGpu()}`);
}

function whyNotGpu() {
  if (!app.gpuCheck || app.gpuCheck.agree) return '';
  if (app.gpuCheck.error) return ' (the GPU failed on a test image)';
  return ' (the GPU gave other answers than the CPU on a test image)';
}

// ---- classification --------------------------------------------------------------------

async function run(values) {
  const [height, width] = app.info.imageSize;
  const input = new Tensor(values, [1, height, width, 3]);
  let outputs;
  try {
    outputs = await app.model.run(input);
  } finally {
    input.delete();
  }
  try {
    // A copy: the tensors' memory is freed below.
    return (await outputs[app.outputIndex].data()).slice();
  } finally {
    for (const output of outputs) output.delete();
  }
}

async function classifyPixels({rgba, width, height}) {
  const [modelHeight, modelWidth] = app.info.imageSize;
  const pixels = resizeRgba(rgba, width, height, modelWidth, modelHeight, app.info.transform);
  const start = performance.now();
  const probabilities = toProbabilities(await run(toModelInput(pixels, app.info)), app.info);
  const milliseconds = performance.now() - start;
  app.lastInput = pixels;
  app.lastProbabilities = probabilities;
  showPredictions(topK(probabilities, app.info.labels, app.info.topK), milliseconds);
}

function showPredictions(predictions, milliseconds) {
  const template = $('prediction-template').content;
  const items = predictions.map(({index, name, probability}) => {
    const item = template.firstElementChild.cloneNode(true);
    item.dataset.className = name;
    item.dataset.classIndex = String(index);
    item.dataset.probability = String(probability);
    item.querySelector('.name').textContent = name;
    item.querySelector('.probability').textContent = `${(probability * 100).toFixed(1)}%`;
    item.querySelector('.fill').style.width = `${Math.max(0, Math.min(1, probability)) * 100}%`;
    return item;
  });
  $('predictions').replaceChildren(...items);
  $('timing').textContent = `Inference ${milliseconds.toFixed(1)} ms · ${ACCELERATOR_NAMES[app.accelerator]}`;
  app.results += 1;
}

// Draws an image, bitmap or video frame at most `maxSide` large on white (transparent
// pixels become white, as in Python) and returns its RGBA bytes.
function readPixels(source, width, height, maxSide) {
  const scale = Math.min(1, maxSide / Math.max(width, height));
  const w = Math.max(1, Math.round(width * scale));
  const h = Math.max(1, Math.round(height * scale));
  const canvas = new OffscreenCanvas(w, h);
  const context = canvas.getContext('2d', {willReadFrequently: true});
  context.fillStyle = '#fff';
  context.fillRect(0, 0, w, h);
  context.imageSmoothingQuality = 'high';
  context.drawImage(source, 0, 0, w, h);
  return {rgba: context.getImageData(0, 0, w, h).data, width: w, height: h};
}

async function decode(file) {
  try {
    // Upright as the camera held it (EXIF); the file's own colour values, as Pillow reads them.
    return await createImageBitmap(file, {imageOrientation: 'from-image', colorSpaceConversion: 'none'});
  } catch {
    throw new Error(`${file.name || 'This file'} could not be decoded: it is not an image, or not a format this browser reads. Try a JPEG or PNG.`);
  }
}

let photoUrl = null;

async function classifyFile(file) {
  stopLive();
  clearError();
  const bitmap = await decode(file);
  try {
    if (photoUrl) URL.revokeObjectURL(photoUrl);
    photoUrl = URL.createObjectURL(file);
    $('photo').src = photoUrl;
    $('photo').hidden = false;
    $('placeholder').hidden = true;
    await classifyPixels(readPixels(bitmap, bitmap.width, bitmap.height, MAX_SIDE));
  } finally {
    bitmap.close();
  }
}

// ---- live camera -----------------------------------------------------------------------

async function startLive() {
  clearError();
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new Error('The camera is only available over HTTPS or on localhost. Open the app that way (docs/apps.md), or use Take photo.');
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      video: {facingMode: 'environment', width: {ideal: 640}, height: {ideal: 480}},
      audio: false,
    });
  } catch (error) {
    throw new Error(`The camera could not be opened (${error.name}): allow camera access for this page, or use Take photo.`);
  }
  const video = $('camera');
  video.srcObject = stream;
  await video.play();
  app.live = {stream, frames: 0};
  video.hidden = false;
  $('photo').hidden = true;
  $('placeholder').hidden = true;
  $('live-button').setAttribute('aria-pressed', 'true');
  $('live-button').textContent = 'Stop camera';
  const live = app.live;
  // One frame at a time: the next is read when the last result is on screen.
  const step = async () => {
    if (app.live !== live) return;
    if (video.videoWidth) {
      try {
        await classifyPixels(readPixels(video, video.videoWidth, video.videoHeight, LIVE_MAX_SIDE));
        live.frames += 1;
      } catch (error) {
        stopLive();
        showError(error.message);
        return;
      }
    }
    requestAnimationFrame(step);
  };
  requestAnimationFrame(step);
}

function stopLive() {
  if (!app.live) return;
  for (const track of app.live.stream.getTracks()) track.stop();
  app.live = null;
  const video = $('camera');
  video.srcObject = null;
  video.hidden = true;
  $('live-button').setAttribute('aria-pressed', 'false');
  $('live-button').textContent = 'Live camera';
}

// ---- wiring ----------------------------------------------------------------------------

function enableInputs() {
  for (const id of ['capture-input', 'gallery-input', 'live-button']) $(id).disabled = false;
}

function onFileChosen(event) {
  const input = event.target;
  const [file] = input.files;
  input.value = ''; // the same photo can be chosen again
  if (file) classifyFile(file).catch((error) => showError(error.message));
}

async function start() {
  if ('serviceWorker' in navigator) {
    // Caches the app, LiteRT.js and the model: later visits work offline.
    navigator.serviceWorker.register('sw.js').catch((error) => console.warn('No offline cache:', error));
  }
  $('capture-input').addEventListener('change', onFileChosen);
  $('gallery-input').addEventListener('change', onFileChosen);
  $('live-button').addEventListener('click', () => {
    if (app.live) stopLive();
    else startLive().catch((error) => showError(error.message));
  });
  document.addEventListener('visibilitychange', () => {
    if (document.hidden) stopLive();
  });
  try {
    await loadModel();
    enableInputs();
    document.body.dataset.state = 'ready';
  } catch (error) {
    setStatus('No model');
    showError(`The model failed to load: ${error.message}`);
    document.body.dataset.state = 'failed';
  }
}

app.ready = start();

"""The mobile classifier: an installable offline web app that runs the exported `.tflite` with LiteRT.js."""

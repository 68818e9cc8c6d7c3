"""The desktop classifier: `keras-vit app desktop [--model PATH]`.

`inference` loads models and classifies images with no Qt in sight (testable
alone); `overlay` draws attention maps; `window` is the Qt user interface;
`app` starts it, or renders one result to a screenshot.
"""

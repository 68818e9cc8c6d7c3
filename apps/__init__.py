"""The apps that show what a trained model does: `desktop` (Qt) and `mobile` (an offline web app)."""

"""The in-container helpers (node scripts), shipped as package data and copied into the image."""

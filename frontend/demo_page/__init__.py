"""The demo page's static files (index.html, demo.js, its AudioWorklet pcm-player.js,
demo.css): served by the front at /demo/ and by tritontts-demo for a front elsewhere."""
from pathlib import Path

DEMO_PAGE = Path(__file__).parent

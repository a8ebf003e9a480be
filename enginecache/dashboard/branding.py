"""The dashboard's own icon, drawn here: the favicon Streamlit serves from this server
(`st.set_page_config(page_icon=...)` with an image), so no request leaves the machine for it (a
`:material/...:` or emoji page icon is fetched by the browser from a font CDN). Streamlit's own
fonts (Source Sans, Material Symbols) are bundled with it and served locally too."""

from __future__ import annotations

from functools import lru_cache

from PIL import Image, ImageDraw

SIZE = 64
INK = (24, 88, 160, 255)  # the chip
PAPER = (255, 255, 255, 255)


@lru_cache(maxsize=1)
def page_icon() -> Image.Image:
    """A chip with pins on four sides (the engine), a light square on it (the cached blob)."""
    image = Image.new("RGBA", (SIZE, SIZE), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    for i in range(4):
        at = 16 + i * 10
        draw.rectangle((at, 2, at + 4, 14), fill=INK)
        draw.rectangle((at, SIZE - 15, at + 4, SIZE - 3), fill=INK)
        draw.rectangle((2, at, 14, at + 4), fill=INK)
        draw.rectangle((SIZE - 15, at, SIZE - 3, at + 4), fill=INK)
    draw.rounded_rectangle((10, 10, SIZE - 11, SIZE - 11), radius=7, fill=INK)
    draw.rounded_rectangle((22, 22, SIZE - 23, SIZE - 23), radius=3, fill=PAPER)
    return image

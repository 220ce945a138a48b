// A bar chart written twice, with Node's built-in modules only: as SVG (text) and as PNG (bytes, encoded by hand).
// Run it in a sandbox, then read chart.svg as text and chart.png with encoding "base64": a client that shows
// pictures shows the PNG (see README.md beside this file).
import fs from 'node:fs';
import zlib from 'node:zlib';

const data = [['Mon', 3], ['Tue', 7], ['Wed', 5], ['Thu', 9], ['Fri', 4]];
const width = 250;
const height = 120;
const bar = 30;
const gap = 20;
const top = Math.max(...data.map(([, value]) => value));
const barHeight = (value) => Math.round((value / top) * (height - 20));

// SVG: one rect and one label per bar.
const rects = data.map(([label, value], i) => {
  const x = gap + i * (bar + gap);
  const h = barHeight(value);
  return `<rect x="${x}" y="${height - 15 - h}" width="${bar}" height="${h}" fill="#3b82f6"/>` +
    `<text x="${x + bar / 2}" y="${height - 2}" font-size="10" text-anchor="middle">${label}</text>`;
});
fs.writeFileSync('chart.svg', `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}">` +
  `<rect width="100%" height="100%" fill="white"/>${rects.join('')}</svg>\n`);

// PNG: an RGB pixel buffer, each row led by filter byte 0, deflated into one IDAT chunk.
const pixels = Buffer.alloc((width * 3 + 1) * height, 255);
for (let row = 0; row < height; row += 1) pixels[row * (width * 3 + 1)] = 0;
data.forEach(([, value], i) => {
  const x0 = gap + i * (bar + gap);
  for (let y = height - 15 - barHeight(value); y < height - 15; y += 1) {
    for (let x = x0; x < x0 + bar; x += 1) {
      pixels.set([0x3b, 0x82, 0xf6], y * (width * 3 + 1) + 1 + x * 3);
    }
  }
});
const chunk = (type, body) => {
  const length = Buffer.alloc(4);
  length.writeUInt32BE(body.length);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(zlib.crc32(Buffer.concat([Buffer.from(type), body])));
  return Buffer.concat([length, Buffer.from(type), body, crc]);
};
const header = Buffer.alloc(13);
header.writeUInt32BE(width, 0);
header.writeUInt32BE(height, 4);
header.set([8, 2, 0, 0, 0], 8); // 8-bit RGB, no interlace
fs.writeFileSync('chart.png', Buffer.concat([
  Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
  chunk('IHDR', header),
  chunk('IDAT', zlib.deflateSync(pixels)),
  chunk('IEND', Buffer.alloc(0)),
]));
console.log('wrote chart.svg and chart.png');

//! Screenshots for the simulator: the widget tree drawn as filled rectangles (darker when
//! clickable, text in a tiny bitmap font) and encoded as an uncompressed PNG. Deterministic bytes.

use crate::device::{Hierarchy, Widget};

/// Pixels of the device per pixel of the screenshot.
pub const SCALE: i32 = 4;

/// Renders `h` to PNG bytes (RGB, a quarter of the device resolution).
pub fn render(h: &Hierarchy) -> Vec<u8> {
    let (w, ht) = h.roots.iter().fold((1, 1), |(w, ht), r| {
        (
            w.max(r.bounds.right / SCALE),
            ht.max(r.bounds.bottom / SCALE),
        )
    });
    let mut canvas = Canvas {
        w: w as usize,
        h: ht as usize,
        px: vec![255; (w * ht * 3) as usize],
    };
    for widget in h.widgets() {
        draw(&mut canvas, widget);
    }
    encode_png(canvas.w as u32, canvas.h as u32, &canvas.px)
}

struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    fn fill(&mut self, l: i32, t: i32, r: i32, b: i32, rgb: [u8; 3]) {
        let clamp = |v: i32, max: usize| v.clamp(0, max as i32) as usize;
        for y in clamp(t, self.h)..clamp(b, self.h) {
            for x in clamp(l, self.w)..clamp(r, self.w) {
                let i = (y * self.w + x) * 3;
                self.px[i..i + 3].copy_from_slice(&rgb);
            }
        }
    }
}

fn draw(c: &mut Canvas, w: &Widget) {
    let b = w.bounds;
    let (l, t, r, bt) = (
        b.left / SCALE,
        b.top / SCALE,
        b.right / SCALE,
        b.bottom / SCALE,
    );
    let colour = if w.is_text_field() {
        [250, 250, 235]
    } else if w.clickable || w.long_clickable {
        if w.checked {
            [90, 140, 90]
        } else {
            [150, 160, 190]
        }
    } else if w.children.is_empty() {
        [225, 225, 225]
    } else {
        [245, 245, 245]
    };
    c.fill(l, t, r, bt, colour);
    // A one-pixel outline.
    let edge = [120, 120, 120];
    c.fill(l, t, r, t + 1, edge);
    c.fill(l, bt - 1, r, bt, edge);
    c.fill(l, t, l + 1, bt, edge);
    c.fill(r - 1, t, r, bt, edge);
    // Text in a 3x5 bitmap font drawn at twice its size; unknown characters as blocks.
    let text = if w.text.is_empty() { &w.hint } else { &w.text };
    let ink = if w.text.is_empty() {
        [150, 150, 150]
    } else {
        [20, 20, 20]
    };
    let (mut x, y) = (l + 3, t + (bt - t) / 2 - 5);
    for ch in text.chars() {
        if x + 6 > r - 2 {
            break;
        }
        if !ch.is_whitespace() {
            let bits = glyph(ch).unwrap_or(0x7fff);
            for i in 0..15 {
                if bits & (1 << (14 - i)) != 0 {
                    let (gx, gy) = (x + (i % 3) * 2, y + (i / 3) * 2);
                    c.fill(gx, gy, gx + 2, gy + 2, ink);
                }
            }
        }
        x += 8;
    }
}

/// Rows of a 3x5 glyph, top first, as 15 bits ("1" = ink).
const FONT: &[(char, &str)] = &[
    ('A', "010101111101101"),
    ('B', "110101110101110"),
    ('C', "011100100100011"),
    ('D', "110101101101110"),
    ('E', "111100110100111"),
    ('F', "111100110100100"),
    ('G', "011100101101011"),
    ('H', "101101111101101"),
    ('I', "111010010010111"),
    ('J', "001001001101010"),
    ('K', "101101110101101"),
    ('L', "100100100100111"),
    ('M', "101111111101101"),
    ('N', "110101101101101"),
    ('O', "010101101101010"),
    ('P', "110101110100100"),
    ('Q', "010101101110011"),
    ('R', "110101110101101"),
    ('S', "011100010001110"),
    ('T', "111010010010010"),
    ('U', "101101101101111"),
    ('V', "101101101101010"),
    ('W', "101101111111101"),
    ('X', "101101010101101"),
    ('Y', "101101010010010"),
    ('Z', "111001010100111"),
    ('0', "111101101101111"),
    ('1', "010110010010111"),
    ('2', "110001010100111"),
    ('3', "110001010001110"),
    ('4', "101101111001001"),
    ('5', "111100110001110"),
    ('6', "011100111101111"),
    ('7', "111001010010010"),
    ('8', "111101111101111"),
    ('9', "111101111001110"),
    ('.', "000000000000010"),
    (',', "000000000010100"),
    (':', "000010000010000"),
    ('-', "000000111000000"),
    ('+', "000010111010000"),
    ('%', "101001010100101"),
    ('"', "101101000000000"),
    ('\'', "010010000000000"),
    ('(', "001010010010001"),
    (')', "100010010010100"),
    ('/', "001001010100100"),
    ('?', "110001010000010"),
    ('!', "010010010000010"),
    ('°', "010101010000000"),
];

/// The glyph bits for `ch` (letters case-insensitive), if the font has it.
fn glyph(ch: char) -> Option<u16> {
    let up = ch.to_ascii_uppercase();
    let (_, rows) = FONT.iter().find(|(c, _)| *c == up)?;
    u16::from_str_radix(rows, 2).ok()
}

/// Encodes 8-bit RGB pixels as a PNG with stored (uncompressed) deflate blocks.
pub fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    let row = width as usize * 3;
    let mut raw = Vec::with_capacity((row + 1) * height as usize);
    for y in 0..height as usize {
        raw.push(0); // filter: none
        raw.extend_from_slice(&rgb[y * row..(y + 1) * row]);
    }
    let mut z = vec![0x78, 0x01];
    let mut chunks = raw.chunks(65535).peekable();
    if chunks.peek().is_none() {
        z.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = chunks.next() {
        z.push(u8::from(chunks.peek().is_none()));
        let len = block.len() as u16;
        z.extend_from_slice(&len.to_le_bytes());
        z.extend_from_slice(&(!len).to_le_bytes());
        z.extend_from_slice(block);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, deflate, no filter, no interlace
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &z);
    chunk(&mut out, b"IEND", &[]);
    out
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// CRC-32 (IEEE, as PNG uses it).
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/** The largest frame the client accepts from a server (16 MiB, the protocol's cap). */
export const MAX_FRAME = 16 << 20;

/**
 * Encodes one frame: int32 big-endian L (payload + 5), the UTF-8 payload, and
 * a newline.
 */
export function encode(text: string): Buffer {
  const n = Buffer.byteLength(text);
  const b = Buffer.allocUnsafe(n + 5);
  b.writeInt32BE(n + 5, 0);
  b.write(text, 4);
  b[n + 4] = 0x0a;
  return b;
}

/**
 * Encodes frames one after the other into one buffer (one write for a
 * batch of commands).
 */
export function encodeAll(texts: string[]): Buffer {
  if (texts.length === 1) return encode(texts[0]);
  let n = 0;
  for (const t of texts) n += Buffer.byteLength(t) + 5;
  const b = Buffer.allocUnsafe(n);
  let off = 0;
  for (const t of texts) {
    const len = b.write(t, off + 4);
    b.writeInt32BE(len + 5, off);
    b[off + 4 + len] = 0x0a;
    off += len + 5;
  }
  return b;
}

const EMPTY = Buffer.alloc(0);

/**
 * Decodes frames from a byte stream split in any way. push returns the
 * payloads of the frames completed by the chunk, in order; a malformed frame
 * (L < 5, L above the cap, a last byte other than a newline) throws.
 */
export class Decoder {
  private buf: Buffer = EMPTY;

  /**
   * Decodes chunk. With transient set, chunk is a view of a buffer that its
   * caller reuses after the call (a socket's read buffer): what the decoder
   * keeps of it (a frame not complete yet) is copied.
   */
  push(chunk: Buffer, transient = false): string[] {
    const b = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    const out: string[] = [];
    let off = 0;
    while (b.length - off >= 4) {
      const len = b.readInt32BE(off);
      if (len < 5 || len > MAX_FRAME + 5) {
        this.buf = EMPTY;
        throw new Error(`invalid frame length ${len}`);
      }
      if (b.length - off < len) break;
      if (b[off + len - 1] !== 0x0a) {
        this.buf = EMPTY;
        throw new Error('invalid frame trailer');
      }
      out.push(b.toString('utf8', off + 4, off + len - 1));
      off += len;
    }
    if (off === b.length) this.buf = EMPTY;
    else if (transient && b === chunk) this.buf = Buffer.from(b.subarray(off)); // a copy: chunk's memory is reused
    else this.buf = b.subarray(off);
    return out;
  }
}

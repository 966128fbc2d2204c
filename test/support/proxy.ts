/**
 * A TCP proxy between tidemark and PostgreSQL that fault tests switch
 * between passing bytes, blackholing them (a path that stops answering
 * without closing) and resetting connections.
 *
 * A blackhole is made in user space: the proxy's sockets stay open and its
 * kernel still acknowledges segments and TCP keepalive probes, so what
 * notices a blackholed connection here is a statement's own response bound,
 * not keepalive. Bytes are held, never dropped: on `heal()` each direction
 * gets what was sent to it meanwhile, in order, as a path that comes back
 * would deliver TCP's retransmissions.
 */
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';

/** What the proxy does with traffic: forward it, hold it, or reset every connection. */
export type ProxyMode = 'pass' | 'blackhole' | 'reset';

export interface ProxyOptions {
  /** Where PostgreSQL listens. */
  target: { host: string; port: number };
}

export interface Proxy {
  /** The port the proxy listens on, on 127.0.0.1. */
  readonly port: number;
  /** `baseUrl` with the proxy's host and port in place of the server's. */
  url(baseUrl: string): string;
  /** The current mode; setting it is `heal()`, `blackhole()` or resetting every connection and each new one. */
  mode: ProxyMode;
  /** Closes every open connection in an orderly way (FIN to both ends). */
  drop(): void;
  /** Resets every open connection (RST to both ends). */
  reset(): void;
  /** Stops forwarding on every connection, open or new, keeping the sockets open and the bytes held. */
  blackhole(): void;
  /** Back to pass: held bytes flow, new connections reach the server; a side that closed meanwhile closes the other. */
  heal(): void;
  /** Connections open through the proxy. */
  connections(): number;
  /** Stops listening and destroys every connection. */
  close(): Promise<void>;
}

/** One proxied connection: the client's socket, and the server's once connected. */
class Pair {
  server: Socket | undefined;
  /** Bytes held while blackholed, per direction. */
  private readonly toServer: Buffer[] = [];
  private readonly toClient: Buffer[] = [];
  /** A side that ended (FIN) while blackholed; its end reaches the other side on heal. */
  private clientEnded = false;
  private serverEnded = false;
  private closed = false;

  constructor(
    readonly client: Socket,
    private readonly target: { host: string; port: number },
    private held: boolean,
    private readonly onClose: (pair: Pair) => void,
  ) {
    client.setNoDelay(true);
    client.on('data', (chunk: Buffer) => {
      if (this.held || !this.server) this.toServer.push(chunk);
      else this.write(this.server, chunk, client);
    });
    client.on('end', () => {
      if (this.held || !this.server) this.clientEnded = true;
      else this.server.end();
    });
    client.on('error', () => this.destroy());
    client.on('close', () => {
      // The client is gone: a live path tells the server at once; a
      // blackholed one only when it heals (or never, if the server side
      // was not connected yet).
      if (!this.held) this.destroy();
      else this.clientEnded = true;
    });
    if (!held) this.connectServer();
  }

  get open(): boolean {
    return !this.closed;
  }

  private connectServer(): void {
    const server = connect(this.target.port, this.target.host);
    this.server = server;
    server.setNoDelay(true);
    server.on('data', (chunk: Buffer) => {
      if (this.held) this.toClient.push(chunk);
      else this.write(this.client, chunk, server);
    });
    server.on('end', () => {
      if (this.held) this.serverEnded = true;
      else this.client.end();
    });
    server.on('error', () => {
      if (this.held) this.serverEnded = true;
      else this.destroy();
    });
    server.on('close', () => {
      if (this.held) this.serverEnded = true;
      else this.destroy();
    });
    server.once('connect', () => this.flush());
  }

  /** Writes with backpressure: the source pauses until the destination drains. */
  private write(to: Socket, chunk: Buffer, from: Socket): void {
    if (to.destroyed) return;
    if (!to.write(chunk)) {
      from.pause();
      to.once('drain', () => {
        if (!from.destroyed) from.resume();
      });
    }
  }

  /** Delivers held bytes and ends, in order. */
  private flush(): void {
    if (this.held || this.closed) return;
    const server = this.server;
    if (!server || server.connecting) return; // 'connect' flushes
    for (const chunk of this.toServer.splice(0)) this.write(server, chunk, this.client);
    for (const chunk of this.toClient.splice(0)) this.write(this.client, chunk, server);
    if (this.clientEnded) {
      // The client gave up while blackholed: its server session ends now.
      server.end();
      server.destroySoon();
    }
    if (this.serverEnded) {
      this.client.end();
      this.client.destroySoon();
    }
  }

  hold(): void {
    this.held = true;
  }

  release(): void {
    if (!this.held) return;
    this.held = false;
    if (this.closed) return;
    if (!this.server) {
      if (this.clientEnded) return this.destroy(); // never reached the server
      this.connectServer();
      return;
    }
    this.flush();
  }

  /** Orderly close of both sides (FIN), then the sockets are destroyed. */
  drop(): void {
    this.client.end();
    this.server?.end();
    this.client.destroySoon();
    this.server?.destroySoon();
  }

  /** RST to both sides. */
  reset(): void {
    if (!this.client.destroyed) this.client.resetAndDestroy();
    if (this.server && !this.server.destroyed && !this.server.connecting) this.server.resetAndDestroy();
    else this.server?.destroy();
    this.destroy();
  }

  destroy(): void {
    if (this.closed) return;
    this.closed = true;
    this.client.destroy();
    this.server?.destroy();
    this.onClose(this);
  }
}

/** Starts a proxy on 127.0.0.1 (a free port) to `options.target`. */
export async function startProxy(options: ProxyOptions): Promise<Proxy> {
  const pairs = new Set<Pair>();
  let mode: ProxyMode = 'pass';
  const server = createServer((socket) => {
    if (mode === 'reset') {
      socket.on('error', () => undefined);
      socket.resetAndDestroy();
      return;
    }
    socket.on('error', () => undefined);
    pairs.add(new Pair(socket, options.target, mode === 'blackhole', (p) => pairs.delete(p)));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as AddressInfo).port;

  const setMode = (next: ProxyMode) => {
    mode = next;
    for (const pair of [...pairs]) {
      if (next === 'blackhole') pair.hold();
      else if (next === 'pass') pair.release();
      else pair.reset();
    }
  };

  return {
    port,
    url(baseUrl) {
      const u = new URL(baseUrl);
      u.hostname = '127.0.0.1';
      u.port = String(port);
      return u.toString();
    },
    get mode() {
      return mode;
    },
    set mode(next: ProxyMode) {
      setMode(next);
    },
    drop() {
      for (const pair of [...pairs]) pair.drop();
    },
    reset() {
      for (const pair of [...pairs]) pair.reset();
    },
    blackhole: () => setMode('blackhole'),
    heal: () => setMode('pass'),
    connections: () => [...pairs].filter((p) => p.open).length,
    async close() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const pair of [...pairs]) pair.destroy();
      await closed;
    },
  };
}

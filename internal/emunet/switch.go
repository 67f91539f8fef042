package emunet

import (
	"math/rand/v2"
	"net/netip"
	"time"
)

// minQueue is the least a link's queue holds, in bytes; it holds four
// round trips' worth of the link's bandwidth where that is more.
const minQueue = 1 << 20

// queueTime bounds how long a packet may wait for its turn on a link:
// a packet that would wait longer is dropped, as a switch's full buffer
// drops it.
func (l Link) queueTime() time.Duration {
	bdp := int(l.Rate / 8 * int64(2*l.Delay) / int64(time.Second))
	return l.transmit(max(4*bdp, minQueue))
}

// receive moves h's outgoing packets to their hosts' queues until the
// network closes.
func (nw *Network) receive(h *host) {
	defer nw.wg.Done()
	for {
		buf := nw.buffer()
		n, err := h.tun.Read(buf)
		if err != nil {
			return
		}
		if !nw.route(h, buf[:n], time.Now()) {
			nw.buffers.Put(&buf)
		}
	}
}

// buffer returns a buffer of the link's MTU.
func (nw *Network) buffer() []byte {
	if b, ok := nw.buffers.Get().(*[]byte); ok {
		return (*b)[:cap(*b)]
	}
	return make([]byte, nw.link.mtu())
}

// route shapes p, sent by h at now, and queues it for its destination,
// reporting whether it did: a packet for no host of the network, or one
// the links drop, goes no further.
func (nw *Network) route(h *host, p []byte, now time.Time) bool {
	to := nw.destination(p)
	l := nw.link
	if to == nil || l.Loss > 0 && rand.Float64() < l.Loss {
		h.dropped.Add(1)
		return false
	}
	limit := l.queueTime()
	sent := later(now, h.upFree).Add(l.transmit(len(p)))
	if sent.Sub(now) > limit {
		h.dropped.Add(1)
		return false
	}
	h.upFree = sent
	h.sent.Add(int64(len(p)))
	if !to.enqueue(p, sent, l, limit) {
		to.dropped.Add(1)
		return false
	}
	return true
}

// destination returns the host an IPv4 packet is for, or nil.
func (nw *Network) destination(p []byte) *host {
	if len(p) < 20 || p[0]>>4 != 4 {
		return nil
	}
	dst := netip.AddrFrom4([4]byte(p[16:20]))
	if !subnet.Contains(dst) {
		return nil
	}
	i := int(dst.As4()[3]) - 1
	if i < 0 || i >= len(nw.hosts) {
		return nil
	}
	return nw.hosts[i]
}

// enqueue queues p, which reached the switch at arrived, on h's downlink,
// and reports whether the downlink's queue had room.
func (h *host) enqueue(p []byte, arrived time.Time, l Link, limit time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	done := later(arrived, h.downFree).Add(l.transmit(len(p)))
	if done.Sub(arrived) > limit {
		return false
	}
	h.downFree = done
	at := done.Add(l.Delay)
	if l.Jitter > 0 {
		at = at.Add(time.Duration(rand.Int64N(int64(2*l.Jitter)+1)) - l.Jitter)
	}
	at = later(at, h.last) // in order
	h.last = at
	h.queue = append(h.queue, packet{data: p, at: at})
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return true
}

// early is how much before its time a packet may be delivered rather
// than slept for: less than a timer's precision.
const early = 50 * time.Microsecond

// deliver writes h's incoming packets to its TUN device when they are due,
// until the network closes.
func (nw *Network) deliver(h *host) {
	defer nw.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		h.mu.Lock()
		var next packet
		ready := len(h.queue) > 0
		if ready {
			next = h.queue[0]
		}
		h.mu.Unlock()
		var wait <-chan time.Time
		switch d := time.Until(next.at); {
		case !ready:
		case d <= early:
			h.pop()
			_, err := h.tun.Write(next.data)
			nw.buffers.Put(&next.data)
			if err == nil {
				h.received.Add(int64(len(next.data)))
			} else if nw.closed() {
				return
			}
			continue
		default:
			timer.Reset(d)
			wait = timer.C
		}
		select {
		case <-nw.done:
			return
		case <-h.wake:
		case <-wait:
		}
	}
}

// pop removes the packet at the head of h's queue.
func (h *host) pop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.queue[0] = packet{}
	h.queue = h.queue[1:]
	if len(h.queue) == 0 {
		h.queue = nil
	}
}

// closed reports whether Close has begun.
func (nw *Network) closed() bool {
	select {
	case <-nw.done:
		return true
	default:
		return false
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

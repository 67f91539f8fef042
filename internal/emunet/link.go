package emunet

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Link is what the network does to the traffic of each emulated host:
// every host has a link of this kind to a switch that joins them all.
type Link struct {
	// Rate is the link's bandwidth in bits per second, each way: a host
	// sends at most Rate, and receives at most Rate whoever sends to it.
	// Zero leaves it unlimited.
	Rate int64
	// Delay is the one-way latency between any two hosts (the round trip
	// is twice it).
	Delay time.Duration
	// Jitter varies each packet's delay uniformly within ±Jitter; packets
	// between two hosts stay in order, as on one path.
	Jitter time.Duration
	// Loss is the probability that a packet is dropped, from 0 to 1.
	Loss float64
	// MTU is the size of the largest packet (DefaultMTU if zero). Rate,
	// delay and loss apply per packet.
	MTU int
}

// DefaultMTU is a link's MTU unless set: segments of up to 64 KiB, as a
// host's network stack hands them to a NIC that segments them itself
// (TSO), so that the emulator spends little per byte.
const DefaultMTU = 65000

// ParseLink reads a link from "RATE[,DELAY[,JITTER[,LOSS]]]", e.g.
// "1gbit", "10gbit,0.2ms", "100mbit,20ms,2ms,0.1%". RATE is a number of
// bits per second with a suffix kbit, mbit or gbit ("0" or "inf":
// unlimited); DELAY and JITTER are Go durations; LOSS is a percentage.
func ParseLink(s string) (Link, error) {
	var l Link
	parts := strings.Split(s, ",")
	if len(parts) > 4 || s == "" {
		return l, fmt.Errorf("link %q: expected RATE[,DELAY[,JITTER[,LOSS]]], e.g. 100mbit,20ms", s)
	}
	var err error
	if l.Rate, err = parseRate(parts[0]); err != nil {
		return l, fmt.Errorf("link %q: %w", s, err)
	}
	durations := []*time.Duration{&l.Delay, &l.Jitter}
	for i, p := range parts[1:min(len(parts), 3)] {
		d, err := time.ParseDuration(p)
		if err != nil || d < 0 {
			return l, fmt.Errorf("link %q: %s %q: expected a duration >= 0, e.g. 20ms", s, []string{"delay", "jitter"}[i], p)
		}
		*durations[i] = d
	}
	if len(parts) == 4 {
		pct, err := strconv.ParseFloat(strings.TrimSuffix(parts[3], "%"), 64)
		if err != nil || !strings.HasSuffix(parts[3], "%") || pct < 0 || pct > 100 {
			return l, fmt.Errorf("link %q: loss %q: expected a percentage from 0%% to 100%%, e.g. 0.1%%", s, parts[3])
		}
		l.Loss = pct / 100
	}
	return l, l.validate()
}

// parseRate reads a bandwidth such as 100mbit.
func parseRate(s string) (int64, error) {
	if s == "0" || s == "inf" {
		return 0, nil
	}
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				break
			}
			return int64(f * u.mult), nil
		}
	}
	return 0, fmt.Errorf("rate %q: expected a bandwidth such as 100mbit, 1gbit or 500kbit (0: unlimited)", s)
}

// validate checks l's fields.
func (l Link) validate() error {
	switch {
	case l.Rate < 0:
		return fmt.Errorf("link: rate %d: expected bits per second >= 0", l.Rate)
	case l.Delay < 0 || l.Jitter < 0:
		return fmt.Errorf("link: delay %v, jitter %v: expected durations >= 0", l.Delay, l.Jitter)
	case l.Jitter > l.Delay:
		return fmt.Errorf("link: jitter %v: expected at most the delay, %v", l.Jitter, l.Delay)
	case l.Loss < 0 || l.Loss >= 1:
		return fmt.Errorf("link: loss %v: expected a probability from 0 to below 1", l.Loss)
	case l.MTU != 0 && (l.MTU < 1280 || l.MTU > 65535):
		return fmt.Errorf("link: MTU %d: expected 1280 to 65535", l.MTU)
	}
	return nil
}

func (l Link) mtu() int {
	if l.MTU == 0 {
		return DefaultMTU
	}
	return l.MTU
}

// String returns the link as ParseLink reads it.
func (l Link) String() string {
	s := "inf"
	if l.Rate > 0 {
		s = strconv.FormatFloat(float64(l.Rate)/1e6, 'g', -1, 64) + "mbit"
	}
	return fmt.Sprintf("%s,%v,%v,%g%%", s, l.Delay, l.Jitter, l.Loss*100)
}

// transmit is how long size bytes take on the link.
func (l Link) transmit(size int) time.Duration {
	if l.Rate == 0 {
		return 0
	}
	return time.Duration(int64(size) * 8 * int64(time.Second) / l.Rate)
}

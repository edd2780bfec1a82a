package loadgen

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
)

// TestLoadgenDNS runs `muster loadgen dns` in process, briefly and small:
// every query is answered (none fails), unknown names are NXDOMAIN, and
// the figures line is printed.
func TestLoadgenDNS(t *testing.T) {
	var out, errOut bytes.Buffer
	err := Run(t.Context(), Env{}, []string{"dns", "--services", "5", "--endpoints", "4", "--changes", "20", "--clients", "2", "--duration", "300ms"}, &out, &errOut)
	if err != nil {
		t.Fatalf("loadgen dns: %v\n%s", err, errOut.String())
	}
	m := regexp.MustCompile(`: (\d+) queries, \d+ queries/s; .* (\d+) NOERROR, (\d+) NXDOMAIN, (\d+) truncated, (\d+) errors`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no figures line:\n%s", out.String())
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	if n(1) == 0 || n(2) == 0 || n(3) == 0 || n(4) != 0 || n(5) != 0 {
		t.Fatalf("queries %d, NOERROR %d, NXDOMAIN %d, truncated %d, errors %d: want answers of both kinds, none truncated or failed\n%s",
			n(1), n(2), n(3), n(4), n(5), out.String())
	}
}

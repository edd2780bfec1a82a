package ownership_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/musterhq/muster/internal/ownership"
)

// TestDocsStateTheTiming: the operators' documents give the shard
// timing this package uses: docs/replicas.md's defaults line, the move
// of a killed replica's shards (TTL + Interval), the local deadline
// (TTL - Margin) and the share a joiner takes (ShareTakenWithin), and the
// chart README the same share bound; and no document gives a lease TTL
// or a move time the defaults no longer have (the TTL was 10 s once).
func TestDocsStateTheTiming(t *testing.T) {
	secs := func(d time.Duration) string { return strings.TrimSuffix(fmt.Sprintf("%g", d.Seconds()), ".0") + " s" }
	read := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(string(b)), " ") // line breaks as spaces
	}
	replicas := read("../../docs/replicas.md")
	for _, want := range []string{
		fmt.Sprintf("Timing (defaults): lease TTL %s, rounds every %s, local margin %s.", secs(ownership.DefaultTTL), secs(ownership.DefaultInterval), secs(ownership.DefaultMargin)),
		fmt.Sprintf("taken at the survivors' next round, **within %s**", secs(ownership.DefaultTTL+ownership.DefaultInterval)),
		fmt.Sprintf("**local deadline**, %s after it sent its last renewal", secs(ownership.DefaultTTL-ownership.DefaultMargin)),
		fmt.Sprintf("takes them within %.0f ms", ownership.DefaultOfferPoll.Seconds()*1000),
		fmt.Sprintf("A ready replica takes its share within %s at the defaults (`ownership.ShareTakenWithin`", secs(ownership.ShareTakenWithin)),
		fmt.Sprintf("within %s by default: the %s lease TTL and a %s round", secs(ownership.DefaultTTL+ownership.DefaultInterval), secs(ownership.DefaultTTL), secs(ownership.DefaultInterval)),
	} {
		if !strings.Contains(replicas, want) {
			t.Errorf("docs/replicas.md does not say %q", want)
		}
	}
	chart := read("../../deploy/helm/muster/README.md")
	if want := fmt.Sprintf("takes its share within %s of that (`ownership.ShareTakenWithin`", secs(ownership.ShareTakenWithin)); !strings.Contains(chart, want) {
		t.Errorf("the chart README does not say %q", want)
	}
	stale := regexp.MustCompile(`(?i)(lease(s)? (TTL|expire)[^.]{0,20}\(?10 ?s\b|shard \(10 s|TTL 10 ?s)`)
	for _, name := range []string{"../../docs/replicas.md", "../../docs/reconciliation.md", "../../docs/outages.md", "../../docs/production.md", "../../docs/helm.md", "../../deploy/helm/muster/README.md"} {
		if m := stale.FindString(read(name)); m != "" {
			t.Errorf("%s still says %q", name, m)
		}
	}
}

package xds_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/audit"
)

// TestRefusedTokensAreOnTheAuditRecord (issue 25): a stream opened with a
// token muster does not accept is refused UNAUTHENTICATED and summarised
// in the audit log by source address, as the HTTP surface's are.
func TestRefusedTokensAreOnTheAuditRecord(t *testing.T) {
	t.Parallel()
	e := newEstate(t, apptest.Options{}, map[string][]string{"az1": {"a1"}})
	bad := openDelta(t, rawConn(t, e.XDSAddr, "definitely-not-a-jwt"))
	_ = bad.s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"web"}})
	if err := bad.end(10 * time.Second); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("stream with a malformed token: %v, want Unauthenticated", err)
	}
	ctx := context.Background()
	e.AuthFailures.RunOnce(ctx, false)
	evs, err := audit.List(ctx, db.New(e.Pool), audit.Filter{Action: audit.ActionAuthRefuse, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Target != "127.0.0.1" {
		t.Fatalf("auth.refuse rows: %+v", evs)
	}
	var after struct {
		ByReason map[string]int `json:"by_reason"`
	}
	if err := json.Unmarshal(evs[0].After, &after); err != nil || after.ByReason["malformed"] != 1 {
		t.Fatalf("summary %s (%v)", evs[0].After, err)
	}
}

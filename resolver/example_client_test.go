package resolver_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/musterhq/muster/resolver"
)

// A client routes from its last-known-good files while muster is
// unreachable, and falls back to a documented default for a service it
// has never seen.
func ExampleClient() {
	ctx := context.Background()
	c, err := resolver.New(ctx, resolver.Config{
		URLs:     []string{"http://127.0.0.1:1"}, // nothing listens here
		Services: []string{"api"},
		Token:    func(context.Context) (string, error) { return "token from your issuer", nil },
		Default: func(service string) (resolver.Endpoint, error) {
			return resolver.Endpoint{Address: service + ".internal", Port: 443}, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	e, err := c.ResolveOrDefault(ctx, "api")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(net.JoinHostPort(e.Address, fmt.Sprint(e.Port)))
	// Output: api.internal:443
}

package resolver_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/musterhq/muster/resolver"
)

func exampleView() resolver.View {
	eps := []resolver.Endpoint{
		{InstanceID: "00000000-0000-0000-0000-000000000001", Address: "10.0.0.1", Port: 8080, Zone: "a", State: "eligible", Weight: 1, Health: "known"},
		{InstanceID: "00000000-0000-0000-0000-000000000002", Address: "10.0.0.2", Port: 8080, Zone: "b", State: "unknown", Weight: 0.5, Health: "unknown"},
	}
	return resolver.View{
		Service: "api", Version: 7, Endpoints: eps,
		Zones: map[string]resolver.Zone{
			"a": {Guard: "ok", Eligible: 1, Total: 1, MinHealthyFraction: 0.5},
			"b": {Guard: "ok", Eligible: 1, Total: 1, MinHealthyFraction: 0.5},
		},
		GeneratedAt: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC),
		Checksum:    resolver.Checksum(eps),
	}
}

func ExampleCache_Resolve() {
	clock := func() time.Time { return time.Date(2026, 1, 1, 12, 0, 3, 0, time.UTC) }
	c, err := resolver.NewCache([]string{"api"}, resolver.WithClock(clock))
	if err != nil {
		panic(err)
	}
	if _, err := c.Resolve("api"); errors.Is(err, resolver.ErrNoView) {
		fmt.Println("cold")
	}
	if err := c.ApplyView(exampleView()); err != nil {
		panic(err)
	}
	r, err := c.Resolve("api")
	if err != nil {
		panic(err)
	}
	fmt.Println("version", r.Version(), "age", r.Age(), "routable", r.Routable())
	for _, i := range r.HealthUnknown() {
		fmt.Println("health unknown:", r.Endpoints()[i].Address)
	}
	// Output:
	// cold
	// version 7 age 3s routable 2
	// health unknown: 10.0.0.2
}

func ExampleCache_Pick() {
	c, err := resolver.NewCache([]string{"api"})
	if err != nil {
		panic(err)
	}
	if err := c.ApplyView(exampleView()); err != nil {
		panic(err)
	}
	e, err := c.Pick("api")
	if err != nil {
		panic(err)
	}
	fmt.Println(e.Port)
	// Output: 8080
}

func ExampleCache_ApplyDelta() {
	c, err := resolver.NewCache([]string{"api"})
	if err != nil {
		panic(err)
	}
	v := exampleView()
	if err := c.ApplyView(v); err != nil {
		panic(err)
	}
	// A delta that skips a version is refused; fetch a full view.
	err = c.ApplyDelta(resolver.Delta{Service: "api", FromVersion: 8, Version: 9})
	fmt.Println(errors.Is(err, resolver.ErrGap))

	// Withdrawing instance 2 halves the routable set, which the default
	// shrink cap allows.
	err = c.ApplyDelta(resolver.Delta{
		Service: "api", FromVersion: 7, Version: 8,
		Removals: []string{"00000000-0000-0000-0000-000000000002"},
		Checksum: resolver.Checksum(v.Endpoints[:1]),
	})
	fmt.Println(err)
	r, _ := c.Resolve("api")
	fmt.Println(r.Version(), r.Routable())
	// Output:
	// true
	// <nil>
	// 8 1
}

// Record feeds local passive ejection: after five failures in a row an
// endpoint is left out of Pick, but never more than half the service.
func ExampleCache_Record() {
	c, err := resolver.NewCache([]string{"api"})
	if err != nil {
		panic(err)
	}
	if err := c.ApplyView(exampleView()); err != nil {
		panic(err)
	}
	for range 5 {
		c.Record("api", "00000000-0000-0000-0000-000000000002", false)
	}
	fmt.Println("ejected:", c.Ejected("api"))
	for range 5 {
		c.Record("api", "00000000-0000-0000-0000-000000000001", false)
	}
	fmt.Println("ejected:", c.Ejected("api"), "capped:", c.Stats().EjectionsCapped)
	e, _ := c.Pick("api")
	fmt.Println("pick:", e.Address)
	// Output:
	// ejected: [00000000-0000-0000-0000-000000000002]
	// ejected: [00000000-0000-0000-0000-000000000002] capped: 1
	// pick: 10.0.0.1
}

// A shrink beyond the cap that the registry's counts do not explain is
// held, then followed once the server has stood by it for the confirm
// time (60 s by default). Sweep, which a Client runs every second,
// follows it even if nothing new arrives.
func ExampleHold() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c, err := resolver.NewCache([]string{"api"}, resolver.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	var eps []resolver.Endpoint
	for i := range 4 {
		eps = append(eps, resolver.Endpoint{InstanceID: fmt.Sprintf("00000000-0000-0000-0000-00000000000%d", i), Address: fmt.Sprintf("10.0.0.%d", i), Port: 8080, Zone: "a", State: "eligible", Weight: 1, Health: "known"})
	}
	view := func(version uint64, eps []resolver.Endpoint) resolver.View {
		return resolver.View{Service: "api", Version: version, Endpoints: eps, Checksum: resolver.Checksum(eps),
			Zones: map[string]resolver.Zone{"a": {Guard: "ok", Eligible: len(eps), Total: 4}}}
	}
	if err := c.ApplyView(view(7, eps)); err != nil {
		panic(err)
	}
	err = c.ApplyView(view(8, eps[:1]))
	fmt.Println(errors.Is(err, resolver.ErrShrinkCapped))
	r, _ := c.Resolve("api")
	fmt.Printf("routing v%d (%d), newest v%d (%d), follows at %s\n", r.Version(), r.Routable(), r.Hold.NewestVersion, r.Hold.NewestRoutable, r.Hold.FollowAt.Format(time.TimeOnly))

	now = now.Add(time.Minute)
	c.Sweep()
	r, _ = c.Resolve("api")
	fmt.Printf("routing v%d (%d), holding %v\n", r.Version(), r.Routable(), r.Hold != nil)
	// Output:
	// true
	// routing v7 (4), newest v8 (1), follows at 12:01:00
	// routing v8 (1), holding false
}

package assembler_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/assembler"
)

// region is a simulated region: services with their full inputs, and for
// each the instances currently down.
type region struct {
	svcs []assembler.ServiceInput
	down [][]int
	rng  *rand.Rand
}

func newRegion(services, instances int) *region {
	r := &region{rng: rand.New(rand.NewPCG(1, 2)), down: make([][]int, services)}
	zones := []string{"a", "b", "c"}
	n := 0
	for s := range services {
		in := assembler.ServiceInput{
			Name: fmt.Sprintf("svc-%03d", s), MinHealthyFraction: 0.5,
			Capabilities: []string{"passive", "probe", "readiness", "self"},
		}
		per := instances / services
		if s < instances%services {
			per++
		}
		for i := range per {
			var u uuid.UUID
			u[0], u[1], u[2], u[15] = byte(n>>16), byte(n>>8), byte(n), 7
			n++
			in.Instances = append(in.Instances, assembler.InstanceInput{
				ID: u, Address: fmt.Sprintf("10.%d.%d.%d", s%250, i/250, i%250), Port: 8080,
				Zone: zones[i%3], State: elig, Weight: 1, HealthKnown: true,
			})
		}
		r.svcs = append(r.svcs, in)
	}
	return r
}

// change takes one instance of a random service down, or (when a tenth of
// the service is already down) brings the longest-down one back, and
// returns the service's index.
func (r *region) change(now time.Time) int {
	s := r.rng.IntN(len(r.svcs))
	ins := r.svcs[s].Instances
	if len(r.down[s]) < len(ins)/10 {
		i := r.rng.IntN(len(ins))
		if ins[i].State == elig {
			ins[i].State, ins[i].Weight, ins[i].FirstFailureAt = inelg, 0, now.Add(-2*time.Second)
			r.down[s] = append(r.down[s], i)
			return s
		}
	}
	if len(r.down[s]) > 0 {
		i := r.down[s][0]
		r.down[s] = r.down[s][1:]
		ins[i].State, ins[i].Weight, ins[i].FirstFailureAt = elig, 1, time.Time{}
	}
	return s
}

// benchRegion measures Update+Drain for a 450-service, 60,000-instance
// region at perMinute state changes; one op is one simulated second:
// changes spread over 20 slots of 50 ms, each touched service updated once
// per slot, Drain after each slot.
func benchRegion(b *testing.B, perMinute int) { benchRegionOpts(b, perMinute, assembler.Options{}) }

func benchRegionOpts(b *testing.B, perMinute int, opts assembler.Options) {
	r := newRegion(450, 60_000)
	a := assembler.New(opts)
	vs, err := assembler.NewVersions(1) // the production source
	if err != nil {
		b.Fatal(err)
	}
	now := t0
	for _, s := range r.svcs {
		a.Update(s, now)
	}
	if _, err := a.Drain(now.Add(time.Hour), vs); err != nil {
		b.Fatal(err)
	}
	now = now.Add(2 * time.Hour)
	const slots = 20
	perSecond := float64(perMinute) / 60
	var owed float64
	changes, published := 0, 0
	touched := make([]bool, len(r.svcs))
	var list []int
	b.ReportAllocs()
	for b.Loop() {
		for range slots {
			now = now.Add(time.Second / slots)
			owed += perSecond / slots
			list = list[:0]
			for ; owed >= 1; owed-- {
				s := r.change(now)
				changes++
				if !touched[s] {
					touched[s] = true
					list = append(list, s)
				}
			}
			for _, s := range list {
				touched[s] = false
				a.Update(r.svcs[s], now)
			}
			pubs, err := a.Drain(now, vs)
			if err != nil {
				b.Fatal(err)
			}
			published += len(pubs)
		}
	}
	b.ReportMetric(float64(changes)/float64(b.N), "changes/op")
	b.ReportMetric(float64(published)/float64(b.N), "versions/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(changes, 1)), "ns/change")
}

func BenchmarkRegionSteady(b *testing.B)     { benchRegion(b, 2_500) }
func BenchmarkRegionEvacuation(b *testing.B) { benchRegion(b, 40_000) }

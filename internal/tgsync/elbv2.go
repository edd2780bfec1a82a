package tgsync

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	elb "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"
	"github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2/types"
)

// ELBv2API is the part of the ELBv2 client tgsync calls: the five
// operations its IAM policy grants.
type ELBv2API interface {
	DescribeTargetGroups(ctx context.Context, in *elb.DescribeTargetGroupsInput, opts ...func(*elb.Options)) (*elb.DescribeTargetGroupsOutput, error)
	DescribeTargetGroupAttributes(ctx context.Context, in *elb.DescribeTargetGroupAttributesInput, opts ...func(*elb.Options)) (*elb.DescribeTargetGroupAttributesOutput, error)
	DescribeTargetHealth(ctx context.Context, in *elb.DescribeTargetHealthInput, opts ...func(*elb.Options)) (*elb.DescribeTargetHealthOutput, error)
	RegisterTargets(ctx context.Context, in *elb.RegisterTargetsInput, opts ...func(*elb.Options)) (*elb.RegisterTargetsOutput, error)
	DeregisterTargets(ctx context.Context, in *elb.DeregisterTargetsInput, opts ...func(*elb.Options)) (*elb.DeregisterTargetsOutput, error)
}

// NewELBv2Client builds the SDK client from an aws.Config (the SDK's
// default chain, or static credentials in tests) with tgsync's retryer:
// the SDK's standard retryer (jittered exponential backoff; throttling
// and transient errors retried) with cfg's attempts and backoff.
func NewELBv2Client(awsCfg aws.Config, cfg AWSConfig) *elb.Client {
	attempts, backoff := cfg.MaxAttempts, cfg.MaxBackoff
	if attempts <= 0 {
		attempts = DefaultAWSMaxAttempts
	}
	if backoff <= 0 {
		backoff = DefaultAWSMaxBackoff
	}
	return elb.NewFromConfig(awsCfg, func(o *elb.Options) {
		if cfg.EndpointURL != "" {
			o.BaseEndpoint = aws.String(cfg.EndpointURL)
		}
		if cfg.Region != "" {
			o.Region = cfg.Region
		}
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = attempts
			so.MaxBackoff = backoff
		})
	})
}

// ELBv2 drives one target group of type ip.
type ELBv2 struct {
	api  ELBv2API
	arn  string
	port int // the group's port: a target registered without one gets it

	// Calls counts API calls (retries are inside one call).
	Calls atomic.Uint64

	mu        sync.Mutex
	slowStart int       // slow_start.duration_seconds, as last read
	attrsAt   time.Time // when it was read
}

// attrsEvery is how often the group's slow-start attribute is read again.
const attrsEvery = 5 * time.Minute

// ELBv2MaxBatch is the most targets one Register or Deregister call
// carries.
const ELBv2MaxBatch = 100

// NewELBv2 checks the target group (it exists and is of type ip) and
// returns its backend.
func NewELBv2(ctx context.Context, api ELBv2API, t ELBv2Target) (*ELBv2, error) {
	e := &ELBv2{api: api, arn: t.TargetGroupARN}
	e.Calls.Add(1)
	out, err := api.DescribeTargetGroups(ctx, &elb.DescribeTargetGroupsInput{TargetGroupArns: []string{t.TargetGroupARN}})
	if err != nil {
		return nil, fmt.Errorf("describe target group %s: %w", t.TargetGroupARN, err)
	}
	if len(out.TargetGroups) != 1 {
		return nil, fmt.Errorf("describe target group %s: %d groups answered", t.TargetGroupARN, len(out.TargetGroups))
	}
	g := out.TargetGroups[0]
	if g.TargetType != types.TargetTypeEnumIp {
		return nil, fmt.Errorf("target group %s is of type %q: tgsync registers addresses, so it needs a group of type ip", t.TargetGroupARN, g.TargetType)
	}
	if g.Port != nil {
		e.port = int(*g.Port)
	}
	return e, nil
}

// State reads the group's targets (DescribeTargetHealth; targets
// draining are already leaving and not counted) and, every few minutes,
// whether it ramps new targets itself (slow_start.duration_seconds).
func (e *ELBv2) State(ctx context.Context) (Group, error) {
	if err := e.readAttrs(ctx); err != nil {
		return Group{}, err
	}
	e.Calls.Add(1)
	out, err := e.api.DescribeTargetHealth(ctx, &elb.DescribeTargetHealthInput{TargetGroupArn: aws.String(e.arn)})
	if err != nil {
		return Group{}, fmt.Errorf("describe target health: %w", err)
	}
	e.mu.Lock()
	g := Group{Ramps: e.slowStart > 0}
	e.mu.Unlock()
	for _, d := range out.TargetHealthDescriptions {
		if d.Target == nil || d.Target.Id == nil {
			continue
		}
		state := ""
		if d.TargetHealth != nil {
			state = string(d.TargetHealth.State)
		}
		if state == string(types.TargetHealthStateEnumDraining) {
			continue
		}
		port := e.port
		if d.Target.Port != nil {
			port = int(*d.Target.Port)
		}
		g.Targets = append(g.Targets, Have{Key: Key{Addr: *d.Target.Id, Port: port}, State: state})
	}
	return g, nil
}

func (e *ELBv2) readAttrs(ctx context.Context) error {
	e.mu.Lock()
	fresh := !e.attrsAt.IsZero() && time.Since(e.attrsAt) < attrsEvery
	e.mu.Unlock()
	if fresh {
		return nil
	}
	e.Calls.Add(1)
	out, err := e.api.DescribeTargetGroupAttributes(ctx, &elb.DescribeTargetGroupAttributesInput{TargetGroupArn: aws.String(e.arn)})
	if err != nil {
		return fmt.Errorf("describe target group attributes: %w", err)
	}
	slow := 0
	for _, a := range out.Attributes {
		if a.Key != nil && *a.Key == "slow_start.duration_seconds" && a.Value != nil {
			slow, _ = strconv.Atoi(*a.Value)
		}
	}
	e.mu.Lock()
	e.slowStart, e.attrsAt = slow, time.Now()
	e.mu.Unlock()
	return nil
}

func targetsOf[T any](xs []T, key func(T) Key) []types.TargetDescription {
	out := make([]types.TargetDescription, 0, len(xs))
	for _, x := range xs {
		k := key(x)
		out = append(out, types.TargetDescription{Id: aws.String(k.Addr), Port: aws.Int32(int32(k.Port))})
	}
	return out
}

// Register registers targets, ELBv2MaxBatch per call.
func (e *ELBv2) Register(ctx context.Context, ws []Want) error {
	all := targetsOf(ws, func(w Want) Key { return w.Key })
	for len(all) > 0 {
		n := min(len(all), ELBv2MaxBatch)
		e.Calls.Add(1)
		if _, err := e.api.RegisterTargets(ctx, &elb.RegisterTargetsInput{TargetGroupArn: aws.String(e.arn), Targets: all[:n]}); err != nil {
			return fmt.Errorf("register %d targets: %w", n, err)
		}
		all = all[n:]
	}
	return nil
}

// Reweight does nothing: ELBv2 has no per-target weight.
func (e *ELBv2) Reweight(context.Context, []Want) error { return nil }

// Deregister deregisters targets, ELBv2MaxBatch per call (the group's
// deregistration delay then drains their connections).
func (e *ELBv2) Deregister(ctx context.Context, hs []Have) error {
	all := targetsOf(hs, func(h Have) Key { return h.Key })
	for len(all) > 0 {
		n := min(len(all), ELBv2MaxBatch)
		e.Calls.Add(1)
		if _, err := e.api.DeregisterTargets(ctx, &elb.DeregisterTargetsInput{TargetGroupArn: aws.String(e.arn), Targets: all[:n]}); err != nil {
			return fmt.Errorf("deregister %d targets: %w", n, err)
		}
		all = all[n:]
	}
	return nil
}

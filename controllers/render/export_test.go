package render

import "math/rand/v2"

// Fleet is fleet for the benchmarks of package render_test.
var Fleet = fleet

// RandomSets returns the first input of TestRendererMatchesRender's random sequence for seed
// and a function that takes the next step, returning the input after it and the step's name
// (the input is the sequence's own: read it, do not modify it).
func RandomSets(seed uint64) (Input, func() (Input, string)) {
	s := &randomSet{rng: rand.New(rand.NewPCG(seed, 21)), versions: seed%2 == 1}
	for i := 0; i < 12; i++ {
		s.in.Nodes = append(s.in.Nodes, s.node(i))
	}
	for i := 0; i < 6; i++ {
		s.in.Pools = append(s.in.Pools, s.pool())
		s.in.Protocols = append(s.in.Protocols, s.protocol())
	}
	for i := 0; i < 8; i++ {
		s.in.Placements = append(s.in.Placements, s.placement())
	}
	return s.in, func() (Input, string) {
		op := s.step()
		return s.in, op
	}
}

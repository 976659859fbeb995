"""Broken variants of the randomization tests and the Theorem 1 construction
(papernotes.rethinking_generalization).

Each function patches the mechanism module in place; the chapter, run with the patch, must stop
on its claim check. The module's own calls look these names up in its globals (and `epoch` up in
the `RandomizedDigits` class), and the experiment (papernotes.rethinking_generalization.experiment)
calls them through the module, so the chapter's runs and constructions all see the patch.
"""

from papernotes import rethinking_generalization as m
from papernotes.rethinking_generalization import experiment


def labels_redrawn_every_epoch():
    """The label corruption is drawn afresh each epoch (a random target transform), not once."""

    def epoch(self):
        return self.train_x, m.corrupt_labels(self.clean_y, self.corruption, self.num_classes)

    m.RandomizedDigits.epoch = epoch


def half_the_asked_corruption():
    """Each label is replaced with probability p / 2 instead of p."""
    right = m.replace_labels

    def replace_labels(labels, fraction, num_classes, generator=None):
        return right(labels, fraction / 2, num_classes, generator)

    m.replace_labels = replace_labels


def corruption_never_changes_a_label():
    """The corruption returns the labels untouched, whatever p."""

    def replace_labels(labels, fraction, num_classes, generator=None):
        return labels.clone()

    m.replace_labels = replace_labels


def shuffled_pixels_permuted_per_image():
    """The shuffled pixels get a permutation for each image instead of one for all of them."""
    m.shuffle_pixels = m.random_pixels


def biases_not_interleaved():
    """Every bias sits below the first projection, so A is full (rank 2), not lower triangular."""
    m.interleaved_biases = experiment.biases_below_the_points


def labels_left_behind_by_the_sort():
    """The projections are sorted but the labels keep their original order."""

    def sort_by_projection(z, y):
        return z.sort().values, y

    m.sort_by_projection = sort_by_projection


def interpolant_without_solving():
    """The kernel interpolant takes alpha = Y (a kernel sum of the labels) instead of solving
    K alpha = Y: it no longer fits its labels."""
    m.interpolate = lambda K, Y: Y.clone()


def descent_gradient_without_the_kernel():
    """Gradient descent on the kernel system takes the residual as if K were the identity,
    alpha <- alpha - eta (alpha - Y): it ends at alpha = Y, not at the minimum-norm solution."""

    def descend(K, Y, steps, lr):
        alpha = Y * 0
        for _ in range(steps):
            alpha = alpha - lr * (alpha - Y)
        return alpha

    m.descend = descend


def weight_decay_never_applied():
    """Every condition trains without its weight decay, whatever it asks for."""
    tests = experiment.randomization_tests

    def without_decay(conditions, **settings):
        conditions = {
            name: experiment.Condition(c.data, weight_decay=0.0, dropout=c.dropout, init=c.init)
            for name, c in conditions.items()
        }
        return tests(conditions, **settings)

    experiment.randomization_tests = without_decay


def dropout_never_applied():
    """Every condition trains without its dropout, whatever rate it asks for."""
    tests = experiment.randomization_tests

    def without_dropout(conditions, **settings):
        conditions = {
            name: experiment.Condition(
                c.data, weight_decay=c.weight_decay, dropout=0.0, init=c.init
            )
            for name, c in conditions.items()
        }
        return tests(conditions, **settings)

    experiment.randomization_tests = without_dropout


MUTANTS = [
    labels_redrawn_every_epoch,
    half_the_asked_corruption,
    corruption_never_changes_a_label,
    shuffled_pixels_permuted_per_image,
    biases_not_interleaved,
    labels_left_behind_by_the_sort,
    interpolant_without_solving,
    descent_gradient_without_the_kernel,
    weight_decay_never_applied,
    dropout_never_applied,
]

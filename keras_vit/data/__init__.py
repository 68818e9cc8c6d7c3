"""The data: reading user images (`images`), datasets from folders, `.zip` files, tfds and the
embedded cifar10-mini (`datasets`), and the tf.data input pipeline (`pipeline`)."""
